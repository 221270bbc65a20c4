package store

import (
	"strconv"
	"time"
)

// SetDBClock makes now the database's clock for this Store's statements
// (leases, grant times, replica heartbeats), in place of the server's.
// It is for tests that drive a controller with a fake clock, so that
// times written and compared on the database's clock follow the same fake
// time; a Store in production never calls it. Call it before the Store is
// shared.
func (s *Store) SetDBClock(now func() time.Time) { s.dbClock = now }

// dbClockMS is the SQL literal of the clock SetDBClock set, in Unix
// milliseconds, and false when none is set.
func (s *Store) dbClockMS() (string, bool) {
	if s.dbClock == nil {
		return "", false
	}
	return strconv.FormatInt(s.dbClock().UnixMilli(), 10), true
}
