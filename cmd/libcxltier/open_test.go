package main

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
)

// openOrCreate against the orders two processes starting together meet:
// the index there, missing, or made by the other between this one's
// open and its create (which then fails with ErrExists, or ErrNoSpace when
// the other's blocks took the room).
func TestOpenOrCreate(t *testing.T) {
	mine, theirs := new(prefix.Store), new(prefix.Store)
	missing := fmt.Errorf("prefix: open: %w", tier.ErrNotFound)
	noSpace := fmt.Errorf("prefix: create: %w", tier.ErrExhausted)
	exists := fmt.Errorf("prefix: create: %w", tier.ErrExists)
	for _, tc := range []struct {
		name     string
		opens    []error // what each open returns, in turn (nil: theirs)
		create   error   // what create returns (nil: mine); unused when noCreate
		noCreate bool
		want     *prefix.Store
		wantErr  error
		wantAny  bool // any error: the create's own
	}{
		{name: "there", opens: []error{nil}, want: theirs},
		{name: "missing, not to be created", opens: []error{missing}, noCreate: true, wantErr: tier.ErrNotFound},
		{name: "missing, created", opens: []error{missing}, want: mine},
		{name: "made meanwhile, create says it exists", opens: []error{missing, nil}, create: exists, want: theirs},
		{name: "made meanwhile, its blocks took the room", opens: []error{missing, nil}, create: noSpace, want: theirs},
		{name: "made while this one waited", opens: []error{missing, missing, missing, nil}, create: noSpace, want: theirs},
		{name: "no room and none made", opens: []error{missing, missing}, create: noSpace, wantErr: tier.ErrExhausted},
		{name: "another failure is not waited on", opens: []error{missing, missing, nil}, create: errors.New("disk on fire"), wantErr: nil, wantAny: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			open := func() (*prefix.Store, error) {
				err := tc.opens[min(calls, len(tc.opens)-1)]
				calls++
				if err != nil {
					return nil, err
				}
				return theirs, nil
			}
			create := func() (*prefix.Store, error) {
				if tc.create != nil {
					return nil, tc.create
				}
				return mine, nil
			}
			if tc.noCreate {
				create = nil
			}
			got, err := openOrCreate(open, create, 200*time.Millisecond)
			if tc.wantAny {
				if err == nil || got != nil {
					t.Fatalf("got %p, %v; want the create's own error", got, err)
				}
				return
			}
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || got != nil {
					t.Fatalf("got %p, %v; want %v", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %p, %v; want %p", got, err, tc.want)
			}
		})
	}
}
