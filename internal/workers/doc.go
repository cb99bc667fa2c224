// Package workers runs short functions on goroutines kept between them.
//
// A new goroutine starts with a small stack and, when a function needs
// more, the runtime copies the stack to one twice the size, as often as it
// takes. A server that starts a goroutine per request pays those copies on
// every request (runtime.copystack was ~5% of a busy brain node's CPU
// profile). A Pool's goroutines keep their grown stacks from one function
// to the next, as gRPC's own stream workers (grpc.NumStreamWorkers) do.
package workers
