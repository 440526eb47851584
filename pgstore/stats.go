package pgstore

import (
	"context"
	"time"

	"github.com/receiptstore/receipts/driver"
)

// Stats implements driver.Engine without a round trip: DiskBytes is the schema's disk usage
// as the last Count measured it (0 before the first). The replay-cache fields stay zero: the
// engine has none.
func (e *engine) Stats() driver.Stats {
	return driver.Stats{DiskBytes: e.diskBytes.Load()}
}

// Count implements driver.Engine: one scan of every partition (visible records by state,
// and those past retention that GC has not dropped yet, by the same clock as every other
// statement), and the schema's disk usage (tables, indexes and TOAST), which Stats then
// reports. LiveEpochs is the number of partitions holding records. Rows do not fail to
// decode here (the columns are typed), so Corrupt stays zero.
func (e *engine) Count(ctx context.Context) (driver.Counts, error) {
	var c driver.Counts
	var now time.Time
	var live int64
	var disk uint64
	err := e.pool.QueryRow(ctx, `WITH t AS MATERIALIZED (SELECT `+e.q.clock("$1")+` AS now),
r AS (SELECT r.epoch, r.state, r.lease_expires_at <= t.now AS ran_out,
             r.updated_at + $2::bigint * interval '1 microsecond' > t.now AS vis
        FROM `+e.q.schema+`.records r, t)
SELECT count(DISTINCT epoch),
       count(*) FILTER (WHERE vis AND state = 1),
       count(*) FILTER (WHERE vis AND state = 1 AND ran_out),
       count(*) FILTER (WHERE vis AND state = 2),
       count(*) FILTER (WHERE vis AND state = 3),
       count(*) FILTER (WHERE NOT vis),
       (SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $3 AND c.relkind IN ('r', 'S')),
       (SELECT now FROM t)
  FROM r`, e.nowArg(), e.retentionUS(), e.o.Schema).Scan(&live, &c.Pending, &c.Abandoned, &c.Succeeded, &c.Failed,
		&c.Expired, &disk, &now)
	if err != nil {
		return driver.Counts{}, errorf("pgstore: count: %w", err)
	}
	e.saw(now, nil)
	e.diskBytes.Store(disk)
	c.LiveEpochs = int(live)
	return c, nil
}
