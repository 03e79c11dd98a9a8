package source

// SetMaxHistoryBytes lowers the history size bound, so a test can cross it
// with a small repository.
func SetMaxHistoryBytes(s *Source, n int64) { s.maxHistory = n }
