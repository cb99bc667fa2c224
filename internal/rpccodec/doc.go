// Package rpccodec is the gRPC codec of brain's servers and of the
// connections between nodes.
//
// It sends three kinds of messages:
//   - Raw frames: bytes already in protobuf wire format (the watch path
//     splices events encoded once for many watchers into them).
//   - Binary messages: brain's internal messages and raft's gogo-generated
//     ones, which marshal themselves (Marshal/Unmarshal), so no generated
//     protobuf code is needed for the internal services.
//   - Everything else through gRPC's protobuf codec (the etcd API).
package rpccodec
