package store

// isPostgresConstraint reports whether err is PostgreSQL refusing a
// statement for violating a constraint of kind c.
func isPostgresConstraint(err error, c constraint) bool { return false }
