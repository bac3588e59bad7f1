package testenv

import (
	"bufio"
	"bytes"
	"strings"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent writers (a logger, a
// process's output) and a test reading what they wrote. The zero value
// is empty and ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *Buffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// String returns what was written so far.
func (w *Buffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// Lines returns the lines written so far that contain substr.
func (w *Buffer) Lines(substr string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(w.String()))
	for sc.Scan() {
		if strings.Contains(sc.Text(), substr) {
			out = append(out, sc.Text())
		}
	}
	return out
}
