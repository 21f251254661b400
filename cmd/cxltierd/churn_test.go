package main

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdminServesTheOperatorThroughConnectionChurn: a local user opening
// connections as fast as the gate closes them (sending nothing) must not
// make /healthz or the token holder fail: their requests arrive on fresh
// connections of the same peer (loopback) as the churner's, and used to be
// closed before their first bytes were read in 10-25% of tries.
func TestAdminServesTheOperatorThroughConnectionChurn(t *testing.T) {
	const secret = "s3cret-s3cret-s3cret"
	t.Setenv(tokenEnv, secret)
	addr, _, _ := startInProcess(t)
	var stop atomic.Bool
	var opened atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held sync.WaitGroup
			defer held.Wait()
			for !stop.Load() {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					continue
				}
				opened.Add(1)
				held.Add(1)
				go func() { // held, sending nothing, until the gate closes it
					defer held.Done()
					c.SetReadDeadline(time.Now().Add(3 * time.Second))
					c.Read(make([]byte, 1))
					c.Close()
				}()
			}
		}()
	}
	defer func() { stop.Store(true); wg.Wait() }()
	time.Sleep(300 * time.Millisecond)

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	failed, tries := 0, 200
	for i := range tries {
		var req *http.Request
		if i%2 == 0 {
			req, _ = http.NewRequest(http.MethodGet, "http://"+addr+"/healthz", nil)
		} else {
			req, _ = http.NewRequest(http.MethodPost, "http://"+addr+"/v1/reap", nil)
			req.Header.Set("Authorization", "Bearer "+secret)
		}
		resp, err := client.Do(req)
		if err != nil || resp.StatusCode != 200 {
			failed++
			if err == nil {
				resp.Body.Close()
			}
			continue
		}
		resp.Body.Close()
	}
	t.Logf("%d churn connections opened meanwhile", opened.Load())
	if failed > 0 {
		t.Fatalf("%d of %d operator requests failed under connection churn", failed, tries)
	}
}
