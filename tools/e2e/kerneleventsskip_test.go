package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// TestKernelEventsSkipRefused: a proxy between the node and `dpxe serve
// --nats-auth` puts a bad name into every check-in answer's nats.skip
// (["GUILD_CREATE", "Bad-Name"]). Go's ParseCheckinResponse refuses the
// answer naming nats.skip[1]; the kernel gives the same verdict: it says
// "nats: access refused: nats.skip[1]" at each answer, takes no broker
// access and never connects, while it keeps checking in.
func TestKernelEventsSkipRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const subnet = "10.142.0"
	l := newGWLab(t, ctx, subnet, gatewayemu.Options{HeartbeatInterval: 2 * time.Second, Shards: 1, MaxConcurrency: 1},
		"--total-shards", "1", "--lease", "30s", "--nats-auth", "--nats-listen", subnet+".1:4222")
	target, err := url.Parse(l.server)
	if err != nil {
		t.Fatal(err)
	}
	goVerdict := make(chan error, 1)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			var c net.Conn
			err := inNetns(l.ns.Name, func() (err error) {
				c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, address)
				return err
			})
			return c, err
		},
	}
	rp.ModifyResponse = func(resp *http.Response) error {
		if !strings.HasSuffix(resp.Request.URL.Path, "/v1/checkin") || resp.StatusCode != http.StatusOK {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		var doc map[string]json.RawMessage
		var nats map[string]any
		if json.Unmarshal(body, &doc) == nil && doc["nats"] != nil && json.Unmarshal(doc["nats"], &nats) == nil {
			nats["skip"] = []string{"GUILD_CREATE", "Bad-Name"}
			doc["nats"], _ = json.Marshal(nats)
			body, _ = json.Marshal(doc)
			_, perr := appliance.ParseCheckinResponse(body)
			select {
			case goVerdict <- perr:
			default:
			}
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	ln, err := listenInNetns(l.ns.Name, subnet+".1:8081")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	l.nodeController = "http://" + subnet + ".1:8081"

	node := l.boot("ev-node", "virtio-net-pci", 1)
	refused := regexp.MustCompile(`(?s:nats: access refused: nats\.skip\[1\].*){2}`)
	if node.serial.waitFor(refused, 120*time.Second) == nil {
		t.Fatalf("the kernel did not refuse nats.skip[1] at two check-ins:\n%s", grepLines(node.serial.String(), "nats"))
	}
	select {
	case err := <-goVerdict:
		var fe *appliance.FieldError
		if !errors.As(err, &fe) || fe.Field != "nats.skip[1]" {
			t.Errorf("Go's verdict on the answer: %v, want a FieldError naming nats.skip[1]", err)
		}
	default:
		t.Error("the proxy rewrote no answer with nats")
	}
	con := node.serial.String()
	if strings.Contains(con, "broker access from the check-in") || strings.Contains(con, "nats: connected to") {
		t.Errorf("the kernel took the access with a bad nats.skip:\n%s", grepLines(con, "nats"))
	}
}
