package tier

import (
	"encoding/hex"
	"time"
)

// Snapshot is a region's state for status pages and offline inspection.
// It is read without locks, so counts may be a moment apart.
type Snapshot struct {
	FormatVersion uint32       `json:"format_version"`
	UUID          string       `json:"uuid"`
	Created       time.Time    `json:"created"`
	Devices       []string     `json:"devices"`
	Coherence     string       `json:"coherence"`
	FormattedAs   string       `json:"formatted_as"`
	Size          int64        `json:"size"`
	ControlSize   int64        `json:"control_size"`
	DeviceSize    int64        `json:"device_size"`
	Stripe        int64        `json:"stripe"`
	Nodes         int          `json:"nodes"`
	LeaseTimeout  string       `json:"lease_timeout"`
	Chunks        ChunkCounts  `json:"chunks"`
	Used          int64        `json:"used"`
	Free          int64        `json:"free"`
	Clients       []LeaseInfo  `json:"clients"`
	Locks         []LockState  `json:"locks"`
	Directory     []DirEntry   `json:"directory"`
	Torn          []string     `json:"torn,omitempty"` // problems found while reading
	Geometry      GeometryJSON `json:"geometry"`
}

// ChunkCounts summarizes the chunk allocator.
type ChunkCounts struct {
	Size   int64 `json:"size"`
	Total  int64 `json:"total"`
	Used   int64 `json:"used"`
	Shared int64 `json:"shared"`
	Free   int64 `json:"free"`
}

// GeometryJSON is the formatted capacity of the fixed areas.
type GeometryJSON struct {
	ClientsPerNode int `json:"clients_per_node"`
	LockSlots      int `json:"lock_slots"`
	DirEntries     int `json:"dir_entries"`
}

// Snapshot reads the region's header, allocator, leases, locks and directory.
func (r *Region) Snapshot() Snapshot {
	inf := r.Info()
	u := r.Usage()
	s := Snapshot{
		FormatVersion: inf.Version,
		UUID:          hex.EncodeToString(inf.UUID[:]),
		Created:       inf.Created.UTC(),
		Devices:       inf.Devices,
		Coherence:     inf.Coherence.String(),
		FormattedAs:   inf.FormattedAs.String(),
		Size:          inf.Size,
		ControlSize:   inf.ControlSize,
		DeviceSize:    inf.Geometry.DeviceSize,
		Stripe:        inf.Geometry.Stripe,
		Nodes:         inf.Geometry.Nodes,
		LeaseTimeout:  inf.Geometry.LeaseTimeout.String(),
		Chunks:        ChunkCounts{Size: u.ChunkSize, Total: u.Chunks, Used: u.UsedChunks, Shared: u.SharedChunks, Free: u.Chunks - u.UsedChunks},
		Used:          u.UsedBytes,
		Free:          u.FreeBytes,
		Clients:       r.Leases(),
		Locks:         r.Locks(),
		Geometry: GeometryJSON{
			ClientsPerNode: inf.Geometry.ClientsPerNode,
			LockSlots:      inf.Geometry.LockSlots,
			DirEntries:     inf.Geometry.DirEntries,
		},
	}
	dir, err := r.DirList()
	if err != nil {
		s.Torn = append(s.Torn, err.Error())
	}
	s.Directory = dir
	// Empty lists are [] in JSON, not null.
	if s.Clients == nil {
		s.Clients = []LeaseInfo{}
	}
	if s.Locks == nil {
		s.Locks = []LockState{}
	}
	if s.Directory == nil {
		s.Directory = []DirEntry{}
	}
	return s
}
