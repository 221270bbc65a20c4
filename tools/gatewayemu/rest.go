package gatewayemu

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
)

// maxFaultBody bounds a POST /debug/fault body.
const maxFaultBody = 64 << 10

// gatewayBotResponse is GET /gateway/bot (research §1.10).
type gatewayBotResponse struct {
	URL               string            `json:"url"`
	Shards            int               `json:"shards"`
	SessionStartLimit SessionStartLimit `json:"session_start_limit"`
}

// apiError is Discord's REST error body.
type apiError struct {
	Message string `json:"message"`
	Code    int    `json:"code"`
}

// RESTHandler serves GET /api/v9|v10/gateway and /gateway/bot.
func (e *Emulator) RESTHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := strings.TrimSuffix(r.URL.Path, "/")
		var route string
		for _, v := range []string{"/api/v10", "/api/v9"} {
			if rest, ok := strings.CutPrefix(path, v); ok {
				route = rest
				break
			}
		}
		if ch, ok := strings.CutPrefix(route, "/channels/"); ok {
			if ch, ok := strings.CutSuffix(ch, "/messages"); ok && !strings.Contains(ch, "/") {
				if r.Method != http.MethodPost {
					writeJSON(w, http.StatusMethodNotAllowed, apiError{Message: "405: Method Not Allowed", Code: 0})
					return
				}
				e.createMessage(w, r, ch)
				return
			}
		}
		switch route {
		case "/gateway", "/gateway/bot":
		default:
			writeJSON(w, http.StatusNotFound, apiError{Message: "404: Not Found", Code: 0})
			return
		}
		if r.Method != http.MethodGet {
			writeJSON(w, http.StatusMethodNotAllowed, apiError{Message: "405: Method Not Allowed", Code: 0})
			return
		}
		if route == "/gateway" {
			writeJSON(w, http.StatusOK, map[string]string{"url": e.URL()})
			return
		}
		auth := r.Header.Get("Authorization")
		tok, ok := strings.CutPrefix(auth, "Bot ")
		e.mu.Lock()
		valid := ok && e.checkTokenLocked(tok)
		var body gatewayBotResponse
		if valid {
			body = gatewayBotResponse{
				URL:               e.urlLocked(),
				Shards:            e.opts.Shards,
				SessionStartLimit: e.startLimitLocked(e.opts.Now()),
			}
		}
		e.mu.Unlock()
		if !valid {
			writeJSON(w, http.StatusUnauthorized, apiError{Message: "401: Unauthorized", Code: 0})
			return
		}
		writeJSON(w, http.StatusOK, body)
	})
}

// ControlHandler serves the debug routes: GET /debug/state, POST
// /debug/fault and GET /debug/ca.pem.
func (e *Emulator) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+StatePath, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, e.State())
	})
	mux.HandleFunc("POST "+FaultPath, func(w http.ResponseWriter, r *http.Request) {
		f, err := DecodeFault(io.LimitReader(r.Body, maxFaultBody))
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		n, err := e.Inject(f)
		switch {
		case errors.Is(err, ErrNoTarget):
			writeJSON(w, http.StatusConflict, map[string]any{"applied": 0, "error": err.Error()})
		case err != nil:
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		default:
			writeJSON(w, http.StatusOK, map[string]int{"applied": n})
		}
	})
	mux.HandleFunc("GET "+CAPath, func(w http.ResponseWriter, r *http.Request) {
		if e.caPEM == nil {
			http.Error(w, "TLS is off: no CA", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/x-pem-file")
		w.Write(e.caPEM)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
