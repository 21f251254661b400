package main

import (
	"bufio"
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestReadReply(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"+OK\r\n", "OK", ""},
		{":42\r\n", "42", ""},
		{"$5\r\nhello\r\n", "hello", ""},
		{"$0\r\n\r\n", "", ""},
		{"$-1\r\n", "", "nil reply"},
		{"-ERR wrong\r\n", "", "ERR wrong"},
		{"$5\r\nhel", "", "read 5-byte bulk"},
		{"$5\r\nhelloXY", "", "not followed by CRLF"},
		{"$-2\r\n", "", "bad bulk length"},
		{"$99999999999\r\n", "", "bad bulk length"},
		{"*1\r\n", "", "unsupported reply type"},
		{"+OK\n", "", "malformed"},
		{"", "", "read reply"},
	} {
		got, err := readReply(bufio.NewReader(strings.NewReader(tc.in)), nil)
		if tc.err == "" && (err != nil || string(got) != tc.want) {
			t.Errorf("%q: %q, %v; want %q", tc.in, got, err, tc.want)
		}
		if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: error %v; want %q", tc.in, err, tc.err)
		}
	}
	if _, err := readReply(bufio.NewReader(strings.NewReader("$-1\r\n")), nil); !errors.Is(err, errRedisNil) {
		t.Errorf("nil bulk: %v", err)
	}
}

// FuzzReadReply: any bytes from the server give a reply or an error, and a
// bulk reply is exactly as long as it said.
func FuzzReadReply(f *testing.F) {
	for _, s := range []string{"+OK\r\n", "$3\r\nabc\r\n", "-E\r\n", "$-1\r\n", ":1\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := readReply(bufio.NewReader(bytes.NewReader(in)), make([]byte, 0, 4))
		if err == nil && in[0] == '$' && !bytes.HasPrefix(in[bytes.IndexByte(in, '\n')+1:], got) {
			t.Fatalf("bulk %q is not what followed the length in %q", got, in)
		}
	})
}
