// Command cgo is a cgo program for the sandbox's compatibility suite: its
// runtime starts every thread with pthread_create, its goroutines call a C
// function concurrently (each blocked call holds a thread of its own), and
// it prints what the C code computed and how many threads it had.
package main

/*
#include <unistd.h>

static unsigned long long sum_squares(unsigned long long from, unsigned long long step, unsigned long long limit)
{
	unsigned long long s = 0;
	for (unsigned long long k = from; k < limit; k += step)
		s += k * k;
	usleep(200000); // hold the thread, so the runtime must start others
	return s;
}
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"sync"
)

const (
	workers = 8
	limit   = 1000000
)

func main() {
	parts := make([]uint64, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			parts[i] = uint64(C.sum_squares(C.ulonglong(i), workers, limit))
		}()
	}
	wg.Wait()
	var total uint64
	for _, p := range parts {
		total += p
	}
	fmt.Printf("cgo sum=%d\n", total)
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "Threads:") {
			fmt.Println("cgo", line)
		}
	}
}
