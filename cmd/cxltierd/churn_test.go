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
//
// The churn is bounded, by count and by connections held at once, so that
// the test does not take a shared host's ephemeral ports (each closed
// connection sits in TIME-WAIT for a minute): an unbounded loop opened
// 400,000 in eight minutes on a loaded machine.
func TestAdminServesTheOperatorThroughConnectionChurn(t *testing.T) {
	const secret = "s3cret-s3cret-s3cret"
	t.Setenv(tokenEnv, secret)
	addr, _, _ := startInProcess(t)
	const churnMost, heldMost = 10000, 1024 // held: past the gate's fresh pool (512), so it closes them
	var stop atomic.Bool
	var opened atomic.Int64
	var churnEnded atomic.Int64 // when the count bound ended the churn, after the start
	begun := time.Now()
	var wg sync.WaitGroup
	slots := make(chan struct{}, heldMost)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held sync.WaitGroup
			defer held.Wait()
			defer func() { churnEnded.CompareAndSwap(0, int64(time.Since(begun))) }()
			for !stop.Load() && opened.Load() < churnMost {
				slots <- struct{}{}
				c, err := net.Dial("tcp", addr)
				if err != nil {
					<-slots
					continue
				}
				opened.Add(1)
				held.Add(1)
				go func() { // held, sending nothing, until the gate closes it
					defer held.Done()
					defer func() { <-slots }()
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
	var why []string
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
				why = append(why, resp.Status)
				resp.Body.Close()
			} else {
				why = append(why, err.Error())
			}
			continue
		}
		resp.Body.Close()
	}
	t.Logf("%d churn connections opened (about %d at most); the operator's requests ran from 0.3 s to %v, "+
		"the churn until %v", opened.Load(), churnMost, time.Since(begun), time.Duration(churnEnded.Load()))
	if failed > 0 {
		t.Fatalf("%d of %d operator requests failed under connection churn: %q", failed, tries, why)
	}
}
