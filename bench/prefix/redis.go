package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// redisServer is a redis-server this benchmark started on loopback, with
// persistence off so it measures the network store, not its disk.
type redisServer struct {
	cmd     *exec.Cmd
	addr    string
	version string
}

func startRedis(bin string) (*redisServer, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("%s not found (Debian: apt-get install redis-server): %w", bin, err)
	}
	ver, _ := exec.Command(path, "--version").Output()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	s := &redisServer{cmd: cmd, addr: fmt.Sprintf("127.0.0.1:%d", port), version: strings.TrimSpace(string(ver))}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := dialRedis(s.addr)
		if err == nil {
			_, err = c.do("PING")
			c.Close()
			if err == nil {
				return s, nil
			}
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("redis-server on %s did not answer: %w", s.addr, err)
		}
	}
}

func (s *redisServer) stop() {
	s.cmd.Process.Kill()
	s.cmd.Wait()
}

// redisConn is the least RESP2 client the baseline needs: commands of bulk
// strings, replies of simple strings, errors, integers and bulk strings.
type redisConn struct {
	conn net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
}

func dialRedis(addr string) (*redisConn, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	return &redisConn{conn: c, r: bufio.NewReaderSize(c, 1<<20), w: bufio.NewWriterSize(c, 1<<20)}, nil
}

func (c *redisConn) Close() error { return c.conn.Close() }

// do sends one command; a bulk reply comes back as its bytes, others as the
// reply line's text.
func (c *redisConn) do(args ...any) ([]byte, error) {
	return c.doInto(nil, args...)
}

// doInto is do reading a bulk reply into dst's storage when it fits.
func (c *redisConn) doInto(dst []byte, args ...any) ([]byte, error) {
	fmt.Fprintf(c.w, "*%d\r\n", len(args))
	for _, a := range args {
		var b []byte
		switch v := a.(type) {
		case string:
			b = []byte(v)
		case []byte:
			b = v
		default:
			return nil, fmt.Errorf("redis: argument of type %T", a)
		}
		fmt.Fprintf(c.w, "$%d\r\n", len(b))
		c.w.Write(b)
		c.w.WriteString("\r\n")
	}
	if err := c.w.Flush(); err != nil {
		return nil, err
	}
	return readReply(c.r, dst)
}

var errRedisNil = errors.New("redis: nil reply")

// readReply parses one RESP2 reply (not arrays: the baseline sends no
// command that returns one).
func readReply(r *bufio.Reader, dst []byte) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return nil, fmt.Errorf("redis: read reply: %w", err)
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("redis: malformed reply line %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+', ':':
		return append(dst[:0], body...), nil
	case '-':
		return nil, fmt.Errorf("redis: %s", body)
	case '$':
		n, err := strconv.ParseInt(string(body), 10, 64)
		switch {
		case err != nil || n < -1 || n > 512<<20:
			return nil, fmt.Errorf("redis: bad bulk length %q", body)
		case n == -1:
			return nil, errRedisNil
		}
		if int64(cap(dst)) < n+2 {
			dst = make([]byte, n+2)
		}
		dst = dst[:n+2]
		if _, err := io.ReadFull(r, dst); err != nil {
			return nil, fmt.Errorf("redis: read %d-byte bulk: %w", n, err)
		}
		if !bytes.Equal(dst[n:], []byte("\r\n")) {
			return nil, fmt.Errorf("redis: bulk of %d bytes not followed by CRLF", n)
		}
		return dst[:n], nil
	}
	return nil, fmt.Errorf("redis: unsupported reply type %q", line[0])
}
