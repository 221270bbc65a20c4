package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
)

// client calls the controller API with a bearer token (the admin token, or
// a simulated node's credential).
type client struct {
	base  string // http://127.0.0.1:8080
	token string
	http  *http.Client
}

func newClient(base, token string) *client {
	return &client{base: strings.TrimRight(base, "/"), token: token, http: &http.Client{Timeout: 10 * time.Second}}
}

// APIError is a non-2xx answer.
type APIError struct {
	Method, Path string
	Status       int
	Body         string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s %s: %d %s", e.Method, e.Path, e.Status, strings.TrimSpace(e.Body))
}

// do sends body (JSON, when not nil) and decodes a 2xx answer into out.
func (c *client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &APIError{Method: method, Path: path, Status: resp.StatusCode, Body: string(data)}
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// Machine is one row of GET /v1/netboot/machines.
type Machine struct {
	MAC      string    `json:"mac"`
	State    string    `json:"state"`
	NodeID   string    `json:"node_id"`
	Firmware string    `json:"firmware"`
	IP       string    `json:"ip"`
	LastSeen time.Time `json:"last_seen"`
}

// Step is one entry of a machine's boot timeline.
type Step struct {
	Stage  string    `json:"stage"`
	Detail string    `json:"detail"`
	At     time.Time `json:"at"`
}

func (c *client) machines(ctx context.Context) ([]Machine, error) {
	var out struct {
		Machines []Machine `json:"machines"`
	}
	err := c.do(ctx, "GET", "/v1/netboot/machines", nil, &out)
	return out.Machines, err
}

func (c *client) timeline(ctx context.Context, mac string) ([]Step, error) {
	var out struct {
		Timeline []Step `json:"timeline"`
	}
	err := c.do(ctx, "GET", "/v1/netboot/machines/"+mac+"/timeline", nil, &out)
	return out.Timeline, err
}

func (c *client) nodes(ctx context.Context) ([]controller.NodeView, error) {
	var out struct {
		Nodes []controller.NodeView `json:"nodes"`
	}
	err := c.do(ctx, "GET", "/v1/nodes", nil, &out)
	return out.Nodes, err
}

// loginLink asks the dashboard for a one-time login link (see
// docs/dashboard.md) and returns its path.
func (c *client) loginLink(ctx context.Context) (string, time.Time, error) {
	var out struct {
		Path      string    `json:"path"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	err := c.do(ctx, "POST", "/v1/dashboard/login-links", nil, &out)
	return out.Path, out.ExpiresAt, err
}
