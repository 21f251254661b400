package topk

import "time"

// Stats are a pool's counters since New.
type Stats struct {
	Steps        int64         `json:"steps"` // Resolve calls
	Hits         int64         `json:"hits"`
	Misses       int64         `json:"misses"`
	Fills        int64         `json:"fills"`
	Newest       int64         `json:"newest_copies"`
	BytesFetched int64         `json:"bytes_fetched"`
	ResolveTime  time.Duration `json:"resolve_ns"` // summed over steps
	Sequences    int           `json:"sequences"`
	Extents      int64         `json:"extents"`
}

// HitRate is hits / (hits + misses), 0 before any selection.
func (s Stats) HitRate() float64 {
	if s.Hits+s.Misses == 0 {
		return 0
	}
	return float64(s.Hits) / float64(s.Hits+s.Misses)
}

func (s *Stats) add(st Step, d time.Duration) {
	s.Steps++
	s.Hits += int64(st.Hits)
	s.Misses += int64(st.Misses)
	s.Fills += int64(st.Fills)
	s.Newest += int64(st.Newest)
	s.BytesFetched += st.Bytes
	s.ResolveTime += d
}

// Stats returns the pool's counters and its sequence and extent counts.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}
