// userfaultfd constants newer than the system headers (Linux 6.1 here; the kernel is newer).
// Each is guarded so that newer headers win. Values from include/uapi/linux/userfaultfd.h.
#pragma once

#include <linux/userfaultfd.h>
#include <sys/ioctl.h>

#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_POISON
#define UFFD_FEATURE_POISON (1 << 14)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
#endif

#ifndef _UFFDIO_MOVE
#define _UFFDIO_MOVE (0x05)
#endif
#ifndef UFFDIO_MOVE
struct uffdio_move {
  __u64 dst;
  __u64 src;
  __u64 len;
#define UFFDIO_MOVE_MODE_DONTWAKE ((__u64)1 << 0)
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES ((__u64)1 << 1)
  __u64 mode;
  __s64 move;
};
#define UFFDIO_MOVE _IOWR(UFFDIO, _UFFDIO_MOVE, struct uffdio_move)
#endif

#ifndef _UFFDIO_POISON
#define _UFFDIO_POISON (0x08)
#endif
#ifndef UFFDIO_POISON
struct uffdio_poison {
  struct uffdio_range range;
#define UFFDIO_POISON_MODE_DONTWAKE ((__u64)1 << 0)
  __u64 mode;
  __s64 updated;
};
#define UFFDIO_POISON _IOWR(UFFDIO, _UFFDIO_POISON, struct uffdio_poison)
#endif
