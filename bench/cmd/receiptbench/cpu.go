package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// processCPU is this process's CPU time so far (user + system, every thread: the stores'
// background work included).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU measures the CPU time of a PostgreSQL server running on this machine: the
// processes pg_stat_activity lists (client backends and the background processes: WAL
// writer, checkpointer, ...), read from /proc. ok is false if the server is not local or
// /proc cannot be read (then the column is left empty).
type serverCPU struct {
	pool *pgxpool.Pool
	hz   float64
}

func newServerCPU(pool *pgxpool.Pool) *serverCPU {
	if pool == nil {
		return nil
	}
	return &serverCPU{pool: pool, hz: 100} // USER_HZ: 100 on every Linux architecture Go supports
}

// total is the CPU time of the server's processes now.
func (s *serverCPU) total(ctx context.Context) (time.Duration, bool) {
	if s == nil {
		return 0, false
	}
	rows, err := s.pool.Query(ctx, `SELECT pid FROM pg_stat_activity`)
	if err != nil {
		return 0, false
	}
	defer rows.Close()
	var ticks float64
	n := 0
	for rows.Next() {
		var pid int32
		if rows.Scan(&pid) != nil {
			return 0, false
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/stat")
		if err != nil {
			return 0, false // not this machine's (or gone: the sample is unreliable)
		}
		// fields after the command (which may hold spaces): state is field 3, utime 14, stime 15
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 13 {
			return 0, false
		}
		u, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		ticks += u + st
		n++
	}
	if rows.Err() != nil || n == 0 {
		return 0, false
	}
	return time.Duration(ticks / s.hz * float64(time.Second)), true
}
