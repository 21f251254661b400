package tier

import "github.com/cxltier/cxltier/internal/words"

// Word access into the mapped region; internal/words states the invariants
// (b is mapped memory the Region keeps until Close; offsets are aligned).

func u32At(b []byte, off int64) *uint32 { return words.U32At(b, off) }

func u64At(b []byte, off int64) *uint64 { return words.U64At(b, off) }
