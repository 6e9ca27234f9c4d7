package proc

// Supervised sets whether commands run under a supervisor (as when Main was
// called) and returns a function restoring the previous setting.
func Supervised(on bool) (restore func()) {
	prev := mainCalled.Load()
	mainCalled.Store(on)
	return func() { mainCalled.Store(prev) }
}
