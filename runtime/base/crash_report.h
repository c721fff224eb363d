// InstallCrashReport (ZRTIER_CRASH_REPORT=1): when the process dies of SIGSEGV, SIGBUS, SIGFPE,
// SIGILL or SIGABRT, stderr gets one block first -- the signal, the faulting address, the thread's
// name and id (zrtier's threads are named zr-*, base/thread_name.h) and its native stack
// (backtrace_symbols_fd; addr2line or gdb turns the offsets into lines) -- then the handler that
// was installed before runs (Python's faulthandler, say), or the default action: the report
// never changes how the process ends. For the crashes no Python stack explains.
//
// Thread safety: call once, from any thread; the handler uses only async-signal-safe calls but
// backtrace(), which is loaded here beforehand so that it does not allocate in the handler.
#pragma once

namespace zrtier {

void InstallCrashReport();

}  // namespace zrtier
