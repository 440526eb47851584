package receipts

// storedScope is scope as the engine stores it.
func (db *DB) storedScope(scope string) string { return scope }
