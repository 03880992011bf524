package pgsource

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// Runtime division of a running chunk (docs/decisions/036 and 043): the
// owner gives up the keys after a key K it picks with a probe query, so
// the chunk (Lo, Hi] becomes (Lo, K], which it reads on, and (K, Hi], a
// child. K is the key database ordering puts after the lane's last
// emitted key by as many rows as the division's position is past the
// lane's read position, and it must have a successor below Hi (the
// residual holds a row). Positions are row ordinals, like the watermarks:
// the division's position is the ordinal just past K's, as the probe
// counted it.

var (
	_ pipeline.SplitDivider     = (*Source)(nil)
	_ pipeline.DivisionProposer = (*Source)(nil)
)

// MinDivideRows is the fewest rows left, as the plan counted them, that a
// chunk divides.
const MinDivideRows = 2048

// probeTimeout bounds a division's probe query.
const probeTimeout = 10 * time.Second

// DivisionPoint implements [pipeline.DivisionProposer]: the middle of the
// rows the plan counted in the chunk and the lane has not emitted, if at
// least [MinDivideRows] are left.
func (s *Source) DivisionPoint(split spate.SplitID) (int64, bool) {
	l := s.lane(split)
	if l == nil {
		return 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	left := int64(l.weight) - l.next
	if l.done || l.dividing || l.restart || left < MinDivideRows {
		return 0, false
	}
	return l.next + left/2, true
}

// TrySplit implements [pipeline.SplitDivider]. It holds the lane's
// emission while it probes for K, so the lane emits no row past K: the
// rows it read ahead are dropped if the division is kept, and the lane
// reads again from its last key up to K.
func (s *Source) TrySplit(split spate.SplitID, position int64) (spate.Division, bool) {
	l := s.lane(split)
	if l == nil {
		return spate.Division{}, false
	}
	l.mu.Lock()
	if l.done || l.dividing || l.restart {
		l.mu.Unlock()
		return spate.Division{}, false
	}
	l.dividing = true
	from, hi, next, weight := l.chunk.Lo, l.chunk.Hi, l.next, l.weight
	if l.lastKey != nil {
		from = l.lastKey
	}
	l.mu.Unlock()
	cut, ok := s.probeCut(from, hi, max(position-next, 0))
	if !ok {
		l.mu.Lock()
		l.dividing = false
		l.mu.Unlock()
		return spate.Division{}, false
	}
	pos := max(position, next) + 1
	prim, _ := json.Marshal(chunk{Lo: l.chunk.Lo, Hi: &cut})
	res, _ := json.Marshal(chunk{Lo: &cut, Hi: hi})
	pw := uint64(pos)
	rw := uint64(1)
	if weight > pw {
		rw = weight - pw
	}
	return spate.Division{Position: pos, Primary: prim, PrimaryWeight: pw, Residual: res, ResidualWeight: rw}, true
}

// probeCut finds the key skip rows after from (the first key after from
// when skip is 0) that has a successor at or below hi.
func (s *Source) probeCut(from, hi *string, skip int64) (string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, s.cfg)
	if err != nil {
		slog.Warn("pgsource: a division's probe could not connect; the split reads on whole", "table", s.table.Name, "error", err)
		return "", false
	}
	defer c.Close(context.WithoutCancel(ctx))
	t, k := s.table, ident(s.table.Key)
	var conds []string
	if from != nil {
		conds = append(conds, k+" > "+t.keyLit(*from))
	}
	if hi != nil {
		conds = append(conds, k+" <= "+t.keyLit(*hi))
	}
	// The alias keeps ORDER BY on the key, not on its text.
	q := "SELECT " + k + "::text AS spate_key FROM " + t.Name + bounded(conds, s.opts.Where) + " ORDER BY " + k +
		" OFFSET " + strconv.FormatInt(skip, 10) + " LIMIT 2"
	rows, err := c.Query(ctx, q)
	if err != nil {
		slog.Warn("pgsource: a division's probe failed; the split reads on whole", "table", s.table.Name, "error", err)
		return "", false
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(keys) < 2 || keys[0] == keys[1] {
		// Nothing after K to give (or a key repeated at the cut: the
		// rows of one key stay together; the split reads on whole).
		return "", false
	}
	return keys[0], true
}

// SplitDone implements [pipeline.SplitDivider]: a kept division moves the
// chunk's end to K for good, and the runner reads again from its last key
// up to K; a refused one lets the lane emit on.
func (s *Source) SplitDone(split spate.SplitID, d spate.Division, kept bool) {
	l := s.lane(split)
	if l == nil {
		return
	}
	var ch chunk
	if kept && json.Unmarshal(d.Primary, &ch) != nil {
		kept = false // our own encoding: cannot happen
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dividing = false
	if kept {
		l.chunk.Hi, l.weight, l.restart = ch.Hi, d.PrimaryWeight, true
	}
}
