package nsqbus

// The cluster: which nsqds there are (the URL's, or those nsqlookupd
// knows), their HTTP APIs, and the limits they enforce. Calls run on
// their caller's goroutine; lookupCache.mu guards the nodes last looked
// up.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// node is one nsqd.
type node struct {
	tcp  string // host:port clients connect to
	http string // host:port of its HTTP API
}

// lookupCache holds the nsqds nsqlookupd named last, for publishing.
type lookupCache struct {
	mu    sync.Mutex
	nodes []node
	at    time.Time
}

// nodes returns the nsqds to use: the URL's hosts in direct mode; in
// lookup mode those registered with the nsqlookupds, every one when
// topic is "", else those holding topic (none is no error).
func (c *conn) nodes(ctx context.Context, topic string) ([]node, error) {
	if !c.cfg.lookup {
		ns := make([]node, len(c.cfg.hosts))
		for i, h := range c.cfg.hosts {
			ns[i] = node{tcp: h, http: c.cfg.httpAddr(h)}
		}
		return ns, nil
	}
	path, query := "/nodes", url.Values{}
	if topic != "" {
		path, query = "/lookup", url.Values{"topic": {topic}}
	}
	var (
		found []node
		seen  = map[string]bool{}
		errs  []error
		ok    bool
	)
	for _, h := range c.cfg.hosts {
		var resp struct {
			Producers []struct {
				Address  string `json:"broadcast_address"`
				TCPPort  int    `json:"tcp_port"`
				HTTPPort int    `json:"http_port"`
			} `json:"producers"`
		}
		err := c.get(ctx, h, path, query, &resp)
		if errors.Is(err, driver.ErrNotFound) && topic != "" {
			ok = true // no nsqd holds the topic
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("nsqlookupd %s: %w", h, err))
			continue
		}
		ok = true
		for _, p := range resp.Producers {
			n := node{tcp: net.JoinHostPort(p.Address, strconv.Itoa(p.TCPPort)), http: net.JoinHostPort(p.Address, strconv.Itoa(p.HTTPPort))}
			if !seen[n.tcp] {
				seen[n.tcp] = true
				found = append(found, n)
			}
		}
	}
	if !ok {
		return nil, fmt.Errorf("no nsqlookupd answered: %w", errors.Join(errs...))
	}
	return found, nil
}

// publishNodes returns the nsqds to publish to: the URL's, or in lookup
// mode every nsqd registered, looked up again after the poll interval or
// when fresh is set (a publish to the ones known failed). When the
// lookup fails or finds none, the nsqds known last are used.
func (c *conn) publishNodes(ctx context.Context, fresh bool) ([]node, error) {
	if !c.cfg.lookup {
		return c.nodes(ctx, "")
	}
	lc := &c.lookup
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if !fresh && len(lc.nodes) > 0 && time.Since(lc.at) < c.cfg.poll {
		return lc.nodes, nil
	}
	ns, err := c.nodes(ctx, "")
	if len(lc.nodes) > 0 && (err != nil || len(ns) == 0) {
		// An nsqd that restarts is gone from nsqlookupd until it
		// registers again, and may take messages before that: the
		// nsqds known last are better than none.
		return lc.nodes, nil
	}
	if err != nil {
		return nil, err
	}
	if len(ns) == 0 {
		return nil, fmt.Errorf("no nsqd is registered with nsqlookupd %s: %w", strings.Join(c.cfg.hosts, ", "), driver.ErrNotFound)
	}
	lc.nodes, lc.at = ns, time.Now()
	return ns, nil
}

// apiError is an HTTP API's refusal.
type apiError struct {
	Status  int
	Message string
}

func (e *apiError) Error() string { return strconv.Itoa(e.Status) + " " + e.Message }

// Unwrap maps 404 (TOPIC_NOT_FOUND, CHANNEL_NOT_FOUND) to
// driver.ErrNotFound and 400 (INVALID_TOPIC ...) to driver.ErrInvalid.
func (e *apiError) Unwrap() error {
	switch e.Status {
	case http.StatusNotFound:
		return driver.ErrNotFound
	case http.StatusBadRequest:
		return driver.ErrInvalid
	}
	return nil
}

// get calls GET path on the HTTP API at addr and decodes the JSON answer
// into v.
func (c *conn) get(ctx context.Context, addr, path string, query url.Values, v any) error {
	return c.call(ctx, http.MethodGet, addr, path, query, v)
}

// post calls POST path on the HTTP API at addr.
func (c *conn) post(ctx context.Context, addr, path string, query url.Values) error {
	return c.call(ctx, http.MethodPost, addr, path, query, nil)
}

func (c *conn) call(ctx context.Context, method, addr, path string, query url.Values, v any) error {
	u := "http://" + addr + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return err
	}
	// The version 1 API answers with the data alone, not in an envelope.
	req.Header.Set("Accept", "application/vnd.nsq; version=1.0")
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(body, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(body[:min(len(body), 200)]))
		}
		return &apiError{Status: resp.StatusCode, Message: e.Message}
	}
	if v == nil {
		return nil
	}
	return json.Unmarshal(body, v)
}

// limits are what nsqd refuses beyond.
type limits struct {
	maxMsg  int           // --max-msg-size: one message, as encoded
	maxBody int           // --max-body-size: the body of one MPUB
	maxReq  time.Duration // --max-req-timeout: the longest REQ delay
}

// defaultLimits are nsqd's defaults.
var defaultLimits = limits{maxMsg: 1 << 20, maxBody: 5 << 20, maxReq: time.Hour}

// envelopeRoom is what the limit on a message keeps for the envelope
// beyond the body and attributes it carries: member names, quotes,
// specversion.
const envelopeRoom = 512

// bodyBytes is the largest message (driver.Message.Size) that fits in
// maxMsg once encoded: a body in base64 takes 4 bytes for 3; in the
// binary envelope it is as it is.
func (l limits) bodyBytes(binary bool) int {
	if binary {
		return max(1, l.maxMsg-envelopeRoom)
	}
	return max(1, (l.maxMsg-envelopeRoom)*3/4)
}

// readLimits reads each nsqd's limits from its /config API and keeps the
// smallest, so a message that fits one fits all; max_message_bytes in the
// URL lowers the message size, or sets it when no nsqd could be read.
// What cannot be read stays at nsqd's default, with a warning.
func (c *conn) readLimits(ctx context.Context, nodes []node) limits {
	l := defaultLimits
	read := limits{}
	for _, n := range nodes {
		var msg, body, req int64
		err := errors.Join(
			c.get(ctx, n.http, "/config/max_msg_size", nil, &msg),
			c.get(ctx, n.http, "/config/max_body_size", nil, &body),
			c.get(ctx, n.http, "/config/max_req_timeout", nil, &req))
		if err != nil {
			c.log.Warn("cannot read nsqd's limits; assuming its defaults", "nsqd", n.http, "err", err)
			continue
		}
		if read.maxMsg == 0 || int(msg) < read.maxMsg {
			read.maxMsg = int(msg)
		}
		if read.maxBody == 0 || int(body) < read.maxBody {
			read.maxBody = int(body)
		}
		if read.maxReq == 0 || time.Duration(req) < read.maxReq {
			read.maxReq = time.Duration(req)
		}
	}
	if read.maxMsg > 0 {
		l = read
	}
	if c.cfg.maxBytes > 0 && (read.maxMsg == 0 || c.cfg.maxBytes < read.maxMsg) {
		l.maxMsg = c.cfg.maxBytes
	}
	return l
}
