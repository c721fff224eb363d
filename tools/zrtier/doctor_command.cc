// `zrtier doctor`: checks what zrtier needs from this machine and says, one line each, OK / WARN /
// FAIL and what to do about a WARN or FAIL, for the user who runs it. Exit status 1 only if zrtier
// cannot work at all: the engine does not start for this user with these ZRTIER_* settings
// (ProbeEngine: the Engine::Create the shim calls). Every other problem only disables one tier or
// feature.
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <grp.h>
#include <liburing.h>
#include <numa.h>
#include <pwd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/gpu/cuda_driver.h"
#include "runtime/gpu/decode_module.h"
#include "runtime/gpu/fatbins.h"
#include "runtime/os/os.h"
#include "runtime/os/uffd_compat.h"
#include "tools/top/format.h"
#include "tools/zrtier/commands.h"
#include "tools/zrtier/engine_probe.h"
#include "zrtier/options.h"
#include "zrtier/stats_reader.h"
#include "zrtier/version.h"

namespace zrtier::tools {
namespace {

enum class Level { kOk, kWarn, kFail };

struct Doctor {
  int fails = 0;
  int warns = 0;
  bool fatal = false;

  void Line(Level level, const std::string& what, const std::string& detail,
            const std::string& fix = "") {
    const char* tag = level == Level::kOk ? "OK  " : level == Level::kWarn ? "WARN" : "FAIL";
    printf("%s  %-18s %s\n", tag, what.c_str(), detail.c_str());
    if (level != Level::kOk && !fix.empty()) printf("      %-18s -> %s\n", "", fix.c_str());
    if (level == Level::kWarn) ++warns;
    if (level == Level::kFail) ++fails;
  }
};

std::string ReadFirstLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return "";
  while (!line.empty() && (line.back() == ' ' || line.back() == '\n')) line.pop_back();
  return line;
}

void CheckKernel(Doctor* d) {
  utsname u;
  uname(&u);
  int major = 0, minor = 0;
  sscanf(u.release, "%d.%d", &major, &minor);
  int v = major * 100 + minor;
  std::string rel = std::string(u.sysname) + " " + u.release;
  if (v >= 608)
    d->Line(Level::kOk, "kernel", rel + " (>= 6.8: userfaultfd MOVE available)");
  else if (v >= 507)
    d->Line(Level::kWarn, "kernel", rel + " (>= 5.7 works; no UFFDIO_MOVE before 6.8)",
            "upgrade to Linux >= 6.8 for faster fault resolution and eviction (UFFDIO_MOVE)");
  else
    d->Line(Level::kFail, "kernel", rel + " (userfaultfd write-protect needs >= 5.7)",
            "upgrade to Linux >= 5.7 (6.8 or newer recommended)");
}

// "crw------- root:root" for `path`, or "" when it cannot be stat'ed.
std::string ModeAndOwner(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return "";
  std::string mode = S_ISCHR(st.st_mode) ? "c" : S_ISDIR(st.st_mode) ? "d" : "-";
  const char* kRwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) mode += (st.st_mode & (0400 >> i)) ? kRwx[i] : '-';
  const passwd* pw = getpwuid(st.st_uid);
  const group* gr = getgrgid(st.st_gid);
  return mode + " " + (pw ? pw->pw_name : std::to_string(st.st_uid)) + ":" +
         (gr ? gr->gr_name : std::to_string(st.st_gid));
}

std::string UserName() {
  const passwd* pw = getpwuid(geteuid());
  return pw ? pw->pw_name : "uid " + std::to_string(geteuid());
}

// How the engine gets its userfaultfd: Os::Userfaultfd with the arena's flags -- the syscall
// without UFFD_USER_MODE_ONLY (the engine must also resolve faults the kernel takes on the
// program's behalf, as in read() into a pinned buffer), then /dev/userfaultfd. This line explains
// which of the two works and how to open one; whether the engine starts is CheckEngine's verdict.
void CheckUserfaultfd(Doctor* d) {
  const std::string sysctl = ReadFirstLine("/proc/sys/vm/unprivileged_userfaultfd");
  const bool root = geteuid() == 0;
  const std::string who = "vm.unprivileged_userfaultfd=" + (sysctl.empty() ? "?" : sysctl) +
                          (root ? ", root" : ", user " + UserName() + ", not root");
  long sys = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  const int sys_err = sys < 0 ? errno : 0;
  if (sys >= 0) {
    close(static_cast<int>(sys));
    d->Line(Level::kOk, "userfaultfd", "the syscall works (" + who + ")");
    return;
  }
  long fd = Os::Default()->Userfaultfd(O_CLOEXEC | O_NONBLOCK);  // the engine's path
  if (fd >= 0) {
    close(static_cast<int>(fd));
    d->Line(Level::kOk, "userfaultfd",
            std::string("through /dev/userfaultfd (the syscall: ") + strerror(sys_err) + "; " +
                who + ")");
    return;
  }
  int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
  const std::string dev_err = dev < 0 ? strerror(errno) : "USERFAULTFD_IOC_NEW refused";
  if (dev >= 0) close(dev);
  const std::string mode = ModeAndOwner("/dev/userfaultfd");
  d->Line(Level::kFail, "userfaultfd",
          std::string("refused for this user: the syscall: ") + strerror(sys_err) + " (" + who +
              "); /dev/userfaultfd: " + dev_err + (mode.empty() ? "" : " (" + mode + ")"),
          "as root, one of: sysctl -w vm.unprivileged_userfaultfd=1 (persist it in "
          "/etc/sysctl.d/); or let this user open /dev/userfaultfd (Linux >= 6.1): groupadd -f "
          "userfaultfd && chgrp userfaultfd /dev/userfaultfd && chmod 0660 /dev/userfaultfd && "
          "usermod -aG userfaultfd " +
              UserName() + " (a new login picks up the group; a udev rule keeps the mode)");
}

// The kernel features the engine asked for and got (features of the engine's own userfaultfd).
void CheckUserfaultfdFeatures(Doctor* d, uint64_t features) {
  struct Feature {
    const char* name;
    uint64_t bit;
    Level missing;
    const char* why;
  };
  const Feature kFeatures[] = {
      {"WP", UFFD_FEATURE_PAGEFAULT_FLAG_WP, Level::kFail,
       "write-protect: sees the first write to a clean chunk (Linux >= 5.7)"},
      {"WP_ASYNC", UFFD_FEATURE_WP_ASYNC, Level::kWarn,
       "asynchronous dirty tracking (Linux >= 6.7)"},
      {"MOVE", UFFD_FEATURE_MOVE, Level::kWarn,
       "UFFDIO_MOVE: 3.5 us instead of 18 us per 64K fault (Linux >= 6.8)"},
      {"POISON", UFFD_FEATURE_POISON, Level::kWarn,
       "UFFDIO_POISON: a lost chunk raises SIGBUS instead of hanging (Linux >= 6.6)"},
  };
  std::string have, missing;
  Level worst = Level::kOk;
  std::string fix;
  for (const Feature& f : kFeatures) {
    bool ok = (features & f.bit) != 0;
    (ok ? have : missing) += std::string(f.name) + " ";
    if (!ok) {
      worst = std::max(worst, f.missing);
      fix += std::string(f.name) + ": " + f.why + "; ";
    }
  }
  auto trim = [](std::string t) {
    while (!t.empty() && t.back() == ' ') t.pop_back();
    return t;
  };
  d->Line(worst, "uffd features",
          "have " + (have.empty() ? std::string("none") : trim(have)) +
              (missing.empty() ? "" : "; missing " + trim(missing)),
          "upgrade the kernel. " + fix);
}

// The verdict's ground truth: the engine started with this user's ZRTIER_* settings, as the
// preloaded shim starts it (ProbeEngine).
void CheckEngine(Doctor* d) {
  Options opts = Options::FromEnvironment([](const std::string&) {});
  if (opts.Bool(Opt::kDisable))
    d->Line(Level::kWarn, "engine", "ZRTIER_DISABLE=1 is set: the shim passes every call through",
            "unset ZRTIER_DISABLE");
  EngineProbe probe = ProbeEngine(opts);
  if (!probe.status.ok()) {
    d->Line(Level::kFail, "engine",
            "does not start for this user with these settings: " + probe.status.message(),
            "fix the cause above; until then the shim passes every CUDA call through "
            "(ZRTIER_REQUIRE=1 makes that an error)");
    d->fatal = true;
    return;
  }
  CheckUserfaultfdFeatures(d, probe.uffd_features);
  d->Line(Level::kOk, "engine",
          "starts for this user: chunk " + opts.Text(Opt::kChunk) + ", arena " +
              opts.Text(Opt::kArena) + ", store " + opts.String(Opt::kStoreBackend));
}

void CheckIoUring(Doctor* d) {
  std::string disabled = ReadFirstLine("/proc/sys/kernel/io_uring_disabled");
  io_uring ring;
  int r = io_uring_queue_init(8, &ring, 0);
  if (r < 0) {
    d->Line(Level::kWarn, "io_uring",
            std::string("io_uring_queue_init: ") + strerror(-r) +
                (disabled.empty() ? "" : " (kernel.io_uring_disabled=" + disabled + ")"),
            "the file spill tier (T3) is unavailable; sysctl -w kernel.io_uring_disabled=0");
    return;
  }
  io_uring_probe* probe = io_uring_get_probe_ring(&ring);
  std::string ops;
  bool ok = probe != nullptr;
  if (probe) {
    struct {
      const char* name;
      int op;
    } kOps[] = {{"READ", IORING_OP_READ}, {"WRITE", IORING_OP_WRITE}, {"FSYNC", IORING_OP_FSYNC}};
    for (auto& o : kOps) {
      bool has = io_uring_opcode_supported(probe, o.op);
      ops += std::string(" ") + o.name + (has ? "" : "(missing)");
      ok = ok && has;
    }
    io_uring_free_probe(probe);
  }
  io_uring_queue_exit(&ring);
  if (ok)
    d->Line(Level::kOk, "io_uring", "ring set up; probe:" + ops);
  else
    d->Line(Level::kWarn, "io_uring", probe ? "probe:" + ops : "probe unsupported",
            "the spill tier needs READ and WRITE (Linux >= 5.6)");
}

void CheckZram(Doctor* d) {
  std::vector<std::string> devs;
  if (DIR* dir = opendir("/sys/block")) {
    while (dirent* e = readdir(dir))
      if (strncmp(e->d_name, "zram", 4) == 0) devs.push_back(e->d_name);
    closedir(dir);
  }
  std::sort(devs.begin(), devs.end());
  // Reading hot_add adds a device (ZRTIER_ZRAM_DEVICE=auto); the file is root-only.
  const char* kHotAdd = "/sys/class/zram-control/hot_add";
  const bool hot_add = access(kHotAdd, F_OK) == 0;
  const bool hot_add_usable = hot_add && access(kHotAdd, R_OK) == 0;
  if (devs.empty()) {
    d->Line(Level::kWarn, "zram", "no zram device",
            "modprobe zram (the zram tier is optional; the RAM store works without it)");
    return;
  }
  for (const auto& dev : devs) {
    std::string base = "/sys/block/" + dev + "/";
    std::string algos = ReadFirstLine(base + "comp_algorithm");
    uint64_t disksize = strtoull(ReadFirstLine(base + "disksize").c_str(), nullptr, 10);
    // Claiming a device writes its disksize; the tier then reads and writes the device node.
    bool usable = access(("/dev/" + dev).c_str(), R_OK | W_OK) == 0 &&
                  access((base + "disksize").c_str(), W_OK) == 0;
    std::string detail = "/dev/" + dev + ": algorithms " + algos + "; " +
                         (disksize ? "in use, disksize " + HumanBytes(static_cast<double>(disksize))
                                   : std::string("free (disksize 0)"));
    bool zstd = algos.find("zstd") != std::string::npos;
    if (!usable)
      d->Line(Level::kWarn, "zram",
              detail + "; this user cannot configure it (/dev/" + dev + " " +
                  ModeAndOwner("/dev/" + dev) + ", " + base + "disksize " +
                  ModeAndOwner(base + "disksize") + ")",
              "the zram tier (ZRTIER_STORE_BACKEND=ram+zram) needs root; the RAM store and the "
              "file tier work without it");
    else if (!zstd)
      d->Line(Level::kOk, "zram", detail + " (no kernel zstd: zrtier compresses before writing)");
    else
      d->Line(Level::kOk, "zram", detail);
  }
  if (hot_add_usable)
    d->Line(Level::kOk, "zram-control", "hot_add usable: ZRTIER_ZRAM_DEVICE=auto can add a device");
  else if (hot_add)
    d->Line(Level::kWarn, "zram-control",
            std::string("hot_add is root-only (") + ModeAndOwner(kHotAdd) +
                "): ZRTIER_ZRAM_DEVICE=auto cannot add a device for this user",
            "run as root to use the zram tier");
}

void CheckMemlock(Doctor* d) {
  rlimit rl;
  getrlimit(RLIMIT_MEMLOCK, &rl);
  auto text = [](rlim_t v) {
    return v == RLIM_INFINITY ? std::string("unlimited") : HumanBytes(static_cast<double>(v));
  };
  std::string detail = "RLIMIT_MEMLOCK soft " + text(rl.rlim_cur) + ", hard " + text(rl.rlim_max);
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= (64ull << 20))
    d->Line(Level::kOk, "locked memory", detail);
  else
    d->Line(Level::kWarn, "locked memory",
            detail + " (CUDA pins through its driver and ignores it; mlock-based paths need more)",
            "ulimit -l unlimited, or memlock in /etc/security/limits.conf, if pinning fails");
}

// CPU faults on zrtier memory wake the fault handler and then the faulting thread, often on
// another CPU. In a virtual machine whose idle vCPUs halt at once, each wake-up is a trip through
// the hypervisor, which polling before halting avoids (docs/decisions.md, "Idle vCPUs and fault
// latency").
void CheckCpuIdle(Doctor* d) {
  const std::string driver = ReadFirstLine("/sys/devices/system/cpu/cpuidle/current_driver");
  if (driver.empty()) {
    d->Line(Level::kOk, "cpu idle", "no cpuidle driver reported");
    return;
  }
  if (driver != "haltpoll") {
    d->Line(Level::kOk, "cpu idle", "cpuidle driver " + driver);
    return;
  }
  const std::string poll = ReadFirstLine("/sys/module/haltpoll/parameters/guest_halt_poll_ns");
  if (poll == "0")
    d->Line(Level::kWarn, "cpu idle",
            "virtual machine, haltpoll guest_halt_poll_ns=0: idle vCPUs halt at once, so every "
            "CPU fault on zrtier memory pays vCPU wake-ups (tens of microseconds per fault)",
            "echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns if CPU access "
            "latency matters (idle vCPUs then poll up to 200 us, which costs the host CPU time)");
  else
    d->Line(Level::kOk, "cpu idle",
            "virtual machine, haltpoll guest_halt_poll_ns=" + (poll.empty() ? "?" : poll));
}

void CheckNuma(Doctor* d) {
  if (numa_available() < 0) {
    d->Line(Level::kOk, "NUMA", "libnuma: NUMA not available (one node assumed)");
    return;
  }
  int nodes = numa_num_configured_nodes();
  std::string detail = std::to_string(nodes) + " node" + (nodes == 1 ? "" : "s") + ":";
  for (int n = 0; n <= numa_max_node(); ++n) {
    long long free_b = 0;
    long long size = numa_node_size64(n, &free_b);
    if (size < 0) continue;
    detail += " node" + std::to_string(n) + " " + HumanBytes(static_cast<double>(size)) + " (" +
              HumanBytes(static_cast<double>(free_b)) + " free)";
  }
  d->Line(Level::kOk, "NUMA", detail);
}

void CheckCuda(Doctor* d) {
  const char* kNames[] = {"libcudart.so.13", "libcudart.so",
                          "/usr/local/cuda/lib64/libcudart.so.13",
                          "/usr/local/cuda/lib64/libcudart.so"};
  void* h = nullptr;
  std::string found, last_error;
  for (const char* name : kNames) {
    h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (h) {
      found = name;
      break;
    }
    const char* e = dlerror();
    last_error = e ? e : "";
  }
  if (!h) {
    d->Line(Level::kWarn, "libcudart", "not found by dlopen (" + last_error + ")",
            "fine if the program brings its own (PyTorch wheels do); else add CUDA's lib64 to "
            "LD_LIBRARY_PATH");
    return;
  }
  using GetCount = int (*)(int*);
  using GetVersion = int (*)(int*);
  using ErrStr = const char* (*)(int);
  auto get_version = reinterpret_cast<GetVersion>(dlsym(h, "cudaRuntimeGetVersion"));
  int version = 0;
  if (get_version) get_version(&version);
  char vbuf[32];
  snprintf(vbuf, sizeof(vbuf), "%d.%d", version / 1000, (version % 1000) / 10);
  d->Line(Level::kOk, "libcudart", "dlopen(" + found + ") ok, runtime " + vbuf);
  auto get_count = reinterpret_cast<GetCount>(dlsym(h, "cudaGetDeviceCount"));
  auto err_str = reinterpret_cast<ErrStr>(dlsym(h, "cudaGetErrorString"));
  if (!get_count) {
    d->Line(Level::kWarn, "GPU", "cudaGetDeviceCount not exported by " + found);
    return;
  }
  int count = 0;
  int err = get_count(&count);
  if (err != 0 || count == 0) {
    std::string why = err ? std::string("cudaGetDeviceCount: ") + (err_str ? err_str(err) : "?") +
                                " (error " + std::to_string(err) + ")"
                          : "no device";
    d->Line(Level::kWarn, "GPU", "no GPU visible: " + why,
            "zrtier still works on host memory (zrtier demo); CUDA programs need a GPU and driver");
  } else {
    d->Line(Level::kOk, "GPU",
            std::to_string(count) + " device" + (count == 1 ? "" : "s") + " visible");
  }
}

// Which path decodes the chunks an H2D copy sends (issue "decode on the GPU"): the kernel, on the
// copy's stream, for chunks in the GPU format when ZRTIER_GPU_DECODE is on, the kernel is built
// into the library and libcuda.so.1 loads; else the CPU.
void CheckGpuDecode(Doctor* d) {
  Options opts = Options::FromEnvironment([](const std::string&) {});
  const bool on = opts.Bool(Opt::kGpuDecode);
  const std::string codec = opts.String(Opt::kCodec);
  if (!gpu::DecodeKernelBuilt()) {
    d->Line(Level::kOk, "GPU decode",
            "CPU path: this build holds no decode kernel (nvcc was not found when it was built)");
    return;
  }
  const gpu::CudaDriver* driver = nullptr;
  Status st = gpu::CudaDriver::Load(&driver);
  if (!st.ok()) {
    d->Line(Level::kOk, "GPU decode", "CPU path: " + st.ToString());
    return;
  }
  if (!on) {
    d->Line(Level::kOk, "GPU decode",
            "CPU path (ZRTIER_GPU_DECODE=0); kernel built (sm_80, sm_90, PTX), libcuda.so.1 found");
    return;
  }
  d->Line(Level::kOk, "GPU decode",
          codec == "gpu" ? "GPU path: copies of stored chunks decode on the GPU, on their stream "
                           "(a context the kernel cannot load into uses the CPU)"
                         : "CPU path until chunks are stored in the GPU format (ZRTIER_CODEC=" +
                               codec + "; set ZRTIER_CODEC=gpu)");
}

// Which path encodes what a D2H copy sends to the compressed store: the encode kernel, on the
// copy's stream, when ZRTIER_GPU_ENCODE is on, the kernel is built in and libcuda.so.1 loads;
// else the CPU.
void CheckGpuEncode(Doctor* d) {
  Options opts = Options::FromEnvironment([](const std::string&) {});
  if (!gpu::EncodeFatbin().data) {
    d->Line(Level::kOk, "GPU encode",
            "CPU path: this build holds no encode kernel (nvcc was not found when it was built)");
    return;
  }
  if (!opts.Bool(Opt::kGpuEncode)) {
    d->Line(Level::kOk, "GPU encode", "CPU path (ZRTIER_GPU_ENCODE=0)");
    return;
  }
  const gpu::CudaDriver* driver = nullptr;
  if (Status st = gpu::CudaDriver::Load(&driver); !st.ok()) {
    d->Line(Level::kOk, "GPU encode", "CPU path: " + st.ToString());
    return;
  }
  d->Line(Level::kOk, "GPU encode",
          "GPU path: device-to-host copies bound for the compressed store are encoded on the GPU, "
          "on their stream (a context the kernel cannot load into uses the CPU)");
}

void CheckShm(Doctor* d) {
  std::string dir = StatsDir();
  if (access(dir.c_str(), W_OK) == 0)
    d->Line(Level::kOk, "statistics", dir + " writable (zrtier stats, zrtier-top)");
  else
    d->Line(Level::kWarn, "statistics", dir + " not writable: " + strerror(errno),
            "mount a tmpfs at /dev/shm, or ZRTIER_STATS=0");
}

void CheckSpillDir(Doctor* d) {
  Options opts = Options::FromEnvironment([](const std::string&) {});
  const std::string dir = opts.SpillDir();
  std::string probe = dir;
  while (access(probe.c_str(), F_OK) != 0 && probe.find('/') != std::string::npos) {
    probe = probe.substr(0, probe.rfind('/'));
    if (probe.empty()) probe = "/";
  }
  if (access(probe.c_str(), W_OK | X_OK) == 0)
    d->Line(Level::kOk, "spill directory",
            dir + (probe == dir ? " writable" : " (created on first spill under " + probe + ")"));
  else
    d->Line(Level::kWarn, "spill directory",
            dir + ": " + probe + " (" + ModeAndOwner(probe) + ") not writable by " + UserName(),
            "the file tier needs it: set ZRTIER_SPILL_DIR (zrtier run --spill DIR) to an NVMe "
            "directory this user may write, or give the user " +
                probe);
}

int RunDoctor() {
  Doctor d;
  printf("zrtier %s\n", Version());
  CheckKernel(&d);
  CheckUserfaultfd(&d);
  CheckEngine(&d);
  CheckIoUring(&d);
  CheckZram(&d);
  CheckMemlock(&d);
  CheckCpuIdle(&d);
  CheckNuma(&d);
  CheckCuda(&d);
  CheckGpuDecode(&d);
  CheckGpuEncode(&d);
  CheckShm(&d);
  CheckSpillDir(&d);
  printf("libraries: zstd %s (linked)\n", ZSTD_versionString());
  // The models a user relies on without a check to run (README, "Limitations"; ARCHITECTURE).
  printf(
      "fork: a forked child reads every managed buffer as the parent has it at the child's first "
      "touch, in every tier (as plain pinned memory), and its writes stay its own (plain CUDA "
      "pinned memory shares them); the child must not use CUDA\n"
      "security: statistics blocks are created O_EXCL|O_NOFOLLOW, mode 0600, and read only as "
      "regular files of their owner; spill files have no name (O_TMPFILE, or unlinked before "
      "use); every zram and spill entry is checked against its CRC32C on every read\n");
  const std::string user = UserName();
  if (d.fatal)
    printf("verdict: zrtier cannot work here for %s (see FAIL above)\n", user.c_str());
  else if (d.fails + d.warns)
    printf(
        "verdict: zrtier works here for %s; %d warning%s, %d failure%s limit some tiers or "
        "features\n",
        user.c_str(), d.warns, d.warns == 1 ? "" : "s", d.fails, d.fails == 1 ? "" : "s");
  else
    printf("verdict: everything zrtier can use is here for %s\n", user.c_str());
  return d.fatal ? 1 : 0;
}

}  // namespace

void AddDoctorCommand(CLI::App* app) {
  CLI::App* cmd = app->add_subcommand(
      "doctor",
      "check this machine for what zrtier needs (kernel, userfaultfd, io_uring, zram, CUDA)");
  cmd->footer("Exit status 1 only if zrtier cannot work at all here.");
  cmd->callback([] { SetExitStatus(RunDoctor()); });
}

}  // namespace zrtier::tools
