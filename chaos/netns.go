package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// netns is the network of a namespaced cluster: a bridge on the host with
// address .254 and, per node, a namespace whose eth0 (address .i) is a veth
// attached to it. The harness reaches every node through the bridge.
type netns struct {
	id     string // short unique tag in interface and namespace names
	subnet string // "10.77.<x>"
	n      int
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (nw *netns) bridge() string    { return "bc" + nw.id }
func (nw *netns) ns(i int) string   { return fmt.Sprintf("bc%s-n%d", nw.id, i) }
func (nw *netns) veth(i int) string { return fmt.Sprintf("bc%sv%d", nw.id, i) }
func (nw *netns) ip(i int) string   { return fmt.Sprintf("%s.%d", nw.subnet, i) }
func (nw *netns) host() string      { return nw.subnet + ".254" }

func newNetns(n int) (*netns, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("network namespaces need root")
	}
	pid := os.Getpid()
	nw := &netns{id: fmt.Sprint(pid % 100000), subnet: fmt.Sprintf("10.77.%d", pid%250), n: n}
	steps := [][]string{
		{"ip", "link", "add", nw.bridge(), "type", "bridge"},
		{"ip", "addr", "add", nw.host() + "/24", "dev", nw.bridge()},
		{"ip", "link", "set", nw.bridge(), "up"},
		// A host whose FORWARD policy drops (Docker sets it so) would drop
		// bridged traffic between the namespaces too.
		{"iptables", "-I", "FORWARD", "-i", nw.bridge(), "-o", nw.bridge(), "-j", "ACCEPT"},
	}
	for i := 1; i <= n; i++ {
		steps = append(steps,
			[]string{"ip", "netns", "add", nw.ns(i)},
			[]string{"ip", "link", "add", nw.veth(i), "type", "veth", "peer", "name", "eth0", "netns", nw.ns(i)},
			[]string{"ip", "link", "set", nw.veth(i), "master", nw.bridge(), "up"},
			[]string{"ip", "netns", "exec", nw.ns(i), "ip", "addr", "add", nw.ip(i) + "/24", "dev", "eth0"},
			[]string{"ip", "netns", "exec", nw.ns(i), "ip", "link", "set", "eth0", "up"},
			[]string{"ip", "netns", "exec", nw.ns(i), "ip", "link", "set", "lo", "up"},
		)
	}
	for _, s := range steps {
		if err := run(s[0], s[1:]...); err != nil {
			nw.remove()
			return nil, err
		}
	}
	return nw, nil
}

func (nw *netns) remove() {
	for i := 1; i <= nw.n; i++ {
		_ = run("ip", "netns", "del", nw.ns(i))
		_ = run("ip", "link", "del", nw.veth(i))
	}
	_ = run("ip", "link", "del", nw.bridge())
	_ = run("iptables", "-D", "FORWARD", "-i", nw.bridge(), "-o", nw.bridge(), "-j", "ACCEPT")
}

// isolate cuts node i off from the other nodes (not from the harness, so
// its clients still reach it): both directions, or only what it sends when
// oneWay.
func (nw *netns) isolate(i int, oneWay bool) error {
	rules := [][]string{
		{"-A", "OUTPUT", "-d", nw.host(), "-j", "ACCEPT"},
		{"-A", "OUTPUT", "-d", nw.subnet + ".0/24", "-j", "DROP"},
	}
	if !oneWay {
		rules = append(rules,
			[]string{"-A", "INPUT", "-s", nw.host(), "-j", "ACCEPT"},
			[]string{"-A", "INPUT", "-s", nw.subnet + ".0/24", "-j", "DROP"})
	}
	return nw.iptables(i, rules)
}

// cut drops all traffic between node i and node j (rules in i's
// namespace, both directions).
func (nw *netns) cut(i, j int) error {
	return nw.iptables(i, [][]string{
		{"-A", "OUTPUT", "-d", nw.ip(j), "-j", "DROP"},
		{"-A", "INPUT", "-s", nw.ip(j), "-j", "DROP"},
	})
}

func (nw *netns) iptables(i int, rules [][]string) error {
	for _, r := range rules {
		if err := run("ip", append([]string{"netns", "exec", nw.ns(i), "iptables"}, r...)...); err != nil {
			return err
		}
	}
	return nil
}

// slow throttles what node i sends to 2 Mbit/s (a token bucket that queues
// up to 300 ms, so bursts wait) and drops 2% of it at random. (The kernel
// here has no netem for fixed delays.)
func (nw *netns) slow(i int) error {
	if err := run("ip", "netns", "exec", nw.ns(i), "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "2mbit", "burst", "32kbit", "latency", "300ms"); err != nil {
		return err
	}
	return nw.iptables(i, [][]string{{"-A", "OUTPUT", "-d", nw.subnet + ".0/24", "-m", "statistic", "--mode", "random", "--probability", "0.02", "-j", "DROP"}})
}

// heal removes every network fault of node i.
func (nw *netns) heal(i int) {
	_ = run("ip", "netns", "exec", nw.ns(i), "iptables", "-F")
	_ = run("ip", "netns", "exec", nw.ns(i), "tc", "qdisc", "del", "dev", "eth0", "root")
}
