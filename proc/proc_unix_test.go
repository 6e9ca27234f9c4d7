//go:build unix

package proc_test

import "syscall"

func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}
