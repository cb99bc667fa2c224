package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/brainkv/brain/server"
	"github.com/spf13/cobra"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// adminFlags are the flags of the commands that talk to the operator API.
type adminFlags struct {
	endpoints          []string
	cacert, cert, key  string
	insecureSkipVerify bool
	timeout            time.Duration
	// user is etcdctl's --user, username[:password]: with auth on, the
	// operator API needs the root role.
	user string
}

func (a *adminFlags) register(c *cobra.Command) {
	f := c.Flags()
	f.StringSliceVar(&a.endpoints, "endpoints", []string{"http://127.0.0.1:2379"}, "Client URLs of the nodes to ask (all of them, for a complete picture).")
	f.StringVar(&a.cacert, "cacert", "", "CA bundle to verify the nodes' certificates (https endpoints).")
	f.StringVar(&a.cert, "cert", "", "Client certificate (nodes with --client-cert-auth).")
	f.StringVar(&a.key, "key", "", "Client key.")
	f.BoolVar(&a.insecureSkipVerify, "insecure-skip-tls-verify", false, "Do not verify the nodes' certificates.")
	f.DurationVar(&a.timeout, "command-timeout", 5*time.Second, "Timeout of each request.")
	f.StringVar(&a.user, "user", "", "username:password of a user with the root role (clusters with auth enabled).")
}

func (a *adminFlags) client() (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if a.cacert != "" || a.cert != "" || a.insecureSkipVerify {
		var cfg *tls.Config
		var err error
		if a.cacert != "" || a.cert != "" {
			cfg, err = transport.TLSInfo{TrustedCAFile: a.cacert, CertFile: a.cert, KeyFile: a.key}.ClientConfig()
			if err != nil {
				return nil, err
			}
		} else {
			cfg = &tls.Config{}
		}
		cfg.InsecureSkipVerify = a.insecureSkipVerify
		tr.TLSClientConfig = cfg
	}
	// HTTP/1.1: the client port serves gRPC on HTTP/2.
	tr.ForceAttemptHTTP2 = false
	tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	if a.user == "" {
		return &http.Client{Transport: tr, Timeout: a.timeout}, nil
	}
	token, err := a.authenticate(tr.TLSClientConfig)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: tokenTransport{tr, token}, Timeout: a.timeout}, nil
}

// authenticate gets a token for --user from the first endpoint.
func (a *adminFlags) authenticate(tlsCfg *tls.Config) (string, error) {
	name, password, ok := strings.Cut(a.user, ":")
	if !ok {
		return "", fmt.Errorf("--user %s: give the password too, as --user %s:PASSWORD", name, name)
	}
	var eps []string
	for _, ep := range a.endpoints {
		eps = append(eps, normalizeEndpoint(ep))
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, TLS: tlsCfg, DialTimeout: a.timeout, Logger: zap.NewNop()})
	if err != nil {
		return "", err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	resp, err := c.Authenticate(ctx, name, password)
	if err != nil {
		return "", fmt.Errorf("--user %s: %w", name, err)
	}
	return resp.Token, nil
}

// tokenTransport sends an auth token with every request, as etcd's HTTP
// gateway takes it.
type tokenTransport struct {
	http.RoundTripper
	token string
}

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", t.token)
	return t.RoundTripper.RoundTrip(r)
}

// nodeView is one endpoint's answer.
type nodeView struct {
	endpoint string
	status   *server.NodeStatus
	err      error
}

func (a *adminFlags) statuses() ([]nodeView, error) {
	hc, err := a.client()
	if err != nil {
		return nil, err
	}
	var out []nodeView
	for _, ep := range a.endpoints {
		ep = normalizeEndpoint(ep)
		v := nodeView{endpoint: ep}
		resp, err := hc.Get(ep + "/brain/v1/status")
		if err == nil {
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				err = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
			} else {
				v.status = &server.NodeStatus{}
				err = json.NewDecoder(resp.Body).Decode(v.status)
			}
			resp.Body.Close()
		}
		v.err = err
		out = append(out, v)
	}
	return out, nil
}

func normalizeEndpoint(ep string) string {
	if !strings.Contains(ep, "://") {
		ep = "http://" + ep
	}
	return strings.TrimRight(ep, "/")
}

func statusCmd() *cobra.Command {
	var a adminFlags
	var output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster: members and liveness, partitions with key ranges, leaders, sizes and closed-revision lag",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			views, err := a.statuses()
			if err != nil {
				return err
			}
			if output == "json" {
				var all []any
				for _, v := range views {
					if v.err != nil {
						all = append(all, map[string]string{"endpoint": v.endpoint, "error": v.err.Error()})
					} else {
						all = append(all, v.status)
					}
				}
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(all)
			}
			return printStatus(cmd.OutOrStdout(), views)
		},
	}
	a.register(cmd)
	cmd.Flags().StringVarP(&output, "write-out", "w", "table", "Output format: table or json (every node's raw view).")
	return cmd
}

func printStatus(w io.Writer, views []nodeView) error {
	var ok []*server.NodeStatus
	for _, v := range views {
		if v.err != nil {
			fmt.Fprintf(w, "%s: unreachable: %v\n", v.endpoint, v.err)
			continue
		}
		ok = append(ok, v.status)
	}
	if len(ok) == 0 {
		return fmt.Errorf("no node answered")
	}
	var rev, compact int64
	for _, s := range ok {
		rev, compact = max(rev, s.Revision), max(compact, s.CompactRevision)
	}
	fmt.Fprintf(w, "cluster %s: revision %d, compacted at %d, %d of %d queried nodes answered\n\n", ok[0].ClusterID, rev, compact, len(ok), len(views))

	// Members: liveness as the answering nodes' gossip sees it.
	byID := map[string]*server.NodeStatus{}
	for _, s := range ok {
		byID[s.ID] = s
	}
	names := map[string]string{}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tID\tCLIENT URLS\tALIVE (gossip)\tANSWERED\tREVISION\tDISK\tSTALE CLOSED\tALARMS")
	members := ok[0].Members
	for _, m := range members {
		names[m.ID] = m.Name
		up, total := 0, 0
		for _, s := range ok {
			for _, mm := range s.Members {
				if mm.ID == m.ID {
					total++
					if mm.Alive {
						up++
					}
				}
			}
		}
		answered, revs, disk, stale, alarms := "no", "-", "-", "-", ""
		if s := byID[m.ID]; s != nil {
			answered, revs, disk, alarms = "yes", fmt.Sprint(s.Revision), humanBytes(s.DiskBytes), strings.Join(s.Alarms, ",")
			// Partition replicas here whose closed revision is older
			// than the serializable staleness bound.
			stale = "none"
			if len(s.StaleClosed) > 0 {
				var ps []string
				for _, p := range s.StaleClosed {
					ps = append(ps, fmt.Sprint(p))
				}
				stale = strings.Join(ps, ",")
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\t%s\n", m.Name, m.ID, strings.Join(m.ClientURLs, ","), up, total, answered, revs, disk, stale, alarms)
	}
	tw.Flush()
	fmt.Fprintln(w)

	// Groups: each from its leader's view when a leader answered.
	type view struct {
		g    server.GroupStatus
		from string
	}
	groups := map[uint64]view{}
	for _, s := range ok {
		for _, g := range s.Groups {
			cur, seen := groups[g.Group]
			if !seen || (g.Role == "leader" && (cur.g.Role != "leader" || g.Term > cur.g.Term)) {
				groups[g.Group] = view{g, s.Name}
			}
		}
	}
	var ids []uint64
	for id := range groups {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	name := func(id string) string {
		if n := names[id]; n != "" {
			return n
		}
		return id
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tKIND\tKEY RANGE\tLEADER\tTERM\tVOTERS\tLEARNERS\tAPPLIED\tCLOSED\tCLOSED LAG\tSST SIZE")
	for _, id := range ids {
		v := groups[id]
		g := v.g
		leader := name(g.Leader)
		if g.Role != "leader" {
			leader += " (as " + v.from + " sees it)"
		}
		var voters, learners []string
		for _, n := range g.Voters {
			voters = append(voters, name(n))
		}
		for _, n := range g.Learners {
			learners = append(learners, name(n))
		}
		rng, closed, lag, size := "-", "-", "-", "-"
		if g.Kind == "partition" {
			end := g.End
			if end == "" {
				end = "∞"
			}
			rng = fmt.Sprintf("[%q, %s)", g.Start, quoteEnd(end))
			closed, lag, size = fmt.Sprint(g.Closed), fmt.Sprint(g.ClosedLag), humanBytes(g.ApproxBytes)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\t%s\n", g.Group, g.Kind, rng, leader, g.Term,
			strings.Join(voters, ","), strings.Join(learners, ","), g.Applied, closed, lag, size)
	}
	return tw.Flush()
}

func quoteEnd(end string) string {
	if end == "∞" {
		return end
	}
	return fmt.Sprintf("%q", end)
}

func humanBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func transferLeaderCmd() *cobra.Command {
	var a adminFlags
	var group uint64
	var to string
	cmd := &cobra.Command{
		Use:   "transfer-leader",
		Short: "Hand a raft group's leadership (a partition, the TSO or the meta group) to another member",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			views, err := a.statuses()
			if err != nil {
				return err
			}
			var leaderEP, target string
			for _, v := range views {
				if v.err != nil {
					continue
				}
				for _, m := range v.status.Members {
					if m.Name == to || m.ID == to {
						target = m.ID
					}
				}
				for _, g := range v.status.Groups {
					if g.Group == group && g.Role == "leader" {
						leaderEP = v.endpoint
					}
				}
			}
			switch {
			case target == "":
				return fmt.Errorf("no member named or with ID %q", to)
			case leaderEP == "":
				return fmt.Errorf("none of %v leads group %d (ask every node with --endpoints)", a.endpoints, group)
			}
			hc, err := a.client()
			if err != nil {
				return err
			}
			hc.Timeout = max(hc.Timeout, 30*time.Second)
			resp, err := hc.Post(fmt.Sprintf("%s/brain/v1/transfer-leader?group=%d&to=%s", leaderEP, group, url.QueryEscape(target)), "", nil)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
			}
			fmt.Fprint(cmd.OutOrStdout(), string(b))
			return nil
		},
	}
	a.register(cmd)
	cmd.Flags().Uint64Var(&group, "group", 0, "Raft group: 1 the TSO, 2 the meta group, 100.. the partitions (see status).")
	cmd.Flags().StringVar(&to, "to", "", "Member name or ID (hex) to hand the leadership to.")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}

// resolveMember returns the ID (hex) of the member named or numbered ref.
func resolveMember(views []nodeView, ref string) string {
	for _, v := range views {
		if v.err != nil {
			continue
		}
		for _, m := range v.status.Members {
			if m.Name == ref || m.ID == ref {
				return m.ID
			}
		}
	}
	return ""
}

// groupLeader returns the endpoint of the node leading group, or "".
func groupLeader(views []nodeView, group uint64) string {
	for _, v := range views {
		if v.err != nil {
			continue
		}
		for _, g := range v.status.Groups {
			if g.Group == group && g.Role == "leader" {
				return v.endpoint
			}
		}
	}
	return ""
}

func moveReplicaCmd() *cobra.Command {
	var a adminFlags
	var group uint64
	var from, to string
	cmd := &cobra.Command{
		Use:   "move-replica",
		Short: "Move a partition's replica from one member to another (learner, catch-up, promotion, removal)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			hc, err := a.client()
			if err != nil {
				return err
			}
			hc.Timeout = max(hc.Timeout, 3*time.Minute)
			var last string
			for attempt := 0; attempt < 10; attempt++ {
				if attempt > 0 {
					time.Sleep(time.Second)
				}
				views, err := a.statuses()
				if err != nil {
					return err
				}
				fromID, toID := resolveMember(views, from), resolveMember(views, to)
				switch {
				case fromID == "":
					return fmt.Errorf("no member named or with ID %q", from)
				case toID == "":
					return fmt.Errorf("no member named or with ID %q", to)
				}
				ep := groupLeader(views, group)
				if ep == "" {
					last = fmt.Sprintf("none of %v leads group %d", a.endpoints, group)
					continue
				}
				resp, err := hc.Post(fmt.Sprintf("%s/brain/v1/move-replica?group=%d&from=%s&to=%s", ep, group, fromID, toID), "", nil)
				if err != nil {
					return err
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				last = strings.TrimSpace(string(b))
				switch resp.StatusCode {
				case http.StatusOK:
					fmt.Fprintln(cmd.OutOrStdout(), last)
					return nil
				case http.StatusAccepted, http.StatusConflict:
					fmt.Fprintf(cmd.ErrOrStderr(), "%s; asking the leader again\n", last)
					continue
				default:
					return fmt.Errorf("%s: %s", resp.Status, last)
				}
			}
			return fmt.Errorf("group %d: the move did not finish: %s", group, last)
		},
	}
	a.register(cmd)
	cmd.Flags().Uint64Var(&group, "group", 0, "Partition group (100.., see status).")
	cmd.Flags().StringVar(&from, "from", "", "Member name or ID (hex) holding the replica.")
	cmd.Flags().StringVar(&to, "to", "", "Member name or ID (hex) to move it to.")
	_ = cmd.MarkFlagRequired("from")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}

func splitCmd() *cobra.Command {
	var a adminFlags
	cmd := &cobra.Command{
		Use:   "split KEY",
		Short: "Split the partition holding KEY at KEY, online (a new partition takes the keys from KEY to the partition's end)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			hc, err := a.client()
			if err != nil {
				return err
			}
			hc.Timeout = max(hc.Timeout, time.Minute)
			var last error
			for _, ep := range a.endpoints {
				ep = normalizeEndpoint(ep)
				resp, err := hc.Post(fmt.Sprintf("%s/brain/v1/split?key=%s", ep, url.QueryEscape(args[0])), "", nil)
				if err != nil {
					last = err
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
				}
				fmt.Fprint(cmd.OutOrStdout(), string(b))
				return nil
			}
			return fmt.Errorf("no endpoint answered: %w", last)
		},
	}
	a.register(cmd)
	return cmd
}
