package prefix

import "github.com/cxltier/cxltier/internal/words"

// Word access into the mapped tier; internal/words states the invariants
// (b is mapped memory the Region keeps until Close; fields are aligned and
// every structure is line-aligned in the tier).

func u32At(b []byte, off int) *uint32 { return words.U32At(b, int64(off)) }

func u64At(b []byte, off int) *uint64 { return words.U64At(b, int64(off)) }
