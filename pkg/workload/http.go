package workload

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Serve starts the HTTP server on addr and returns the address it listens
// on.
func (w *Workload) Serve(addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: w.handler(), ReadHeaderTimeout: 10 * time.Second}
	w.mu.Lock()
	w.srv = srv
	w.mu.Unlock()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			w.logf("http: %v", err)
		}
	}()
	return ln.Addr(), nil
}

func (w *Workload) handler() http.Handler {
	mux := http.NewServeMux()
	writeJSON := func(rw http.ResponseWriter, b []byte) {
		rw.Header().Set("Content-Type", "application/json")
		rw.Write(b)
	}
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(rw, "ok")
	})
	mux.HandleFunc("GET /status", func(rw http.ResponseWriter, r *http.Request) {
		b, _ := json.Marshal(w.Status())
		writeJSON(rw, append(b, '\n'))
	})
	stop := func(rw http.ResponseWriter, r *http.Request) {
		w.Stop()
		w.mu.Lock()
		b := w.historyJSON
		w.mu.Unlock()
		writeJSON(rw, b)
	}
	mux.HandleFunc("POST /stop", stop)
	mux.HandleFunc("GET /stop", stop)
	mux.HandleFunc("GET /history", func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		b, phase := w.historyJSON, w.phase
		w.mu.Unlock()
		if b == nil {
			http.Error(rw, fmt.Sprintf("the workload is %s: the history is ready once it has stopped (POST /stop)", phase), http.StatusConflict)
			return
		}
		writeJSON(rw, b)
	})
	return mux
}
