"""Sandbox launcher, run as a plain script: ``python -I -S sandbox_launcher.py CONFIG_JSON``.

Started by :func:`hybridflow.sandbox.runner.run_python` (which documents
the guarantees); standard library only, imports nothing from hybridflow.
Steps, in this order because each needs the privileges the next one drops::

    launcher (root)    join the run's memory cgroup (before any fork, so the whole
                       tree is charged to it); chown the work dir to a fresh uid;
                       unshare(mount, network, pid, IPC, UTS namespaces); die with the verifier
                       process (PDEATHSIG); fork
    └─ init (pid 1)    PDEATHSIG (dies with the launcher); child subreaper (orphans
                       stay in the tree, also unisolated); a minimal root (pivot_root
                       to a read-only tmpfs): /usr /etc /bin /lib... read-only, /dev's
                       null zero full random urandom, the work dir at /tmp/sandbox,
                       the interpreter's prefix at its own path, a fresh /proc; the
                       host's other files are not there; fork; wait
       └─ program      the result channel at fd 3, stderr to /dev/null if asked;
                       setgroups([]) setgid setuid(fresh uid); no_new_privs;
                       PDEATHSIG; rlimits; chdir; execve(python -I main.py)

When init exits (the program ended, or the launcher was killed and init got
its PDEATHSIG), the kernel kills every process left in the pid namespace:
nothing the program forked survives it. Without root, a user namespace
provides the same namespaces (if the kernel allows it), but the program does
not start there: the uid change's ``setgroups`` is refused in a user
namespace, so every run of that mode fails to start (as it did before; see
docs/reliability.md). When no namespace can be made, the launcher exits
with :data:`EXIT_UNAVAILABLE` unless the config allows running unisolated.

What the launcher says of itself (the sandbox is unavailable, or runs
unisolated) goes to its status channel (``status_fd``, a file the verifier
opened), which is closed on ``execve``: the program shares stderr with the
launcher, so a marker printed there (and an exit status of 71) is only the
program's output, never taken for the launcher's word.
"""

import ctypes
import json
import os
import resource
import signal
import sys

EXIT_UNAVAILABLE = 71
RESULT_FD = 3
UNAVAILABLE_MARK = "HYBRIDFLOW_SANDBOX_UNAVAILABLE"
UNISOLATED_MARK = "HYBRIDFLOW_SANDBOX_UNISOLATED"
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
CLONE_NEWUTS, CLONE_NEWIPC = 0x04000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1,
    2,
    4,
    8,
    32,
    4096,
    16384,
    1 << 18,
)
MNT_DETACH = 2
PIVOT_ROOT_SYSCALL = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
DEVICES = ("null", "zero", "full", "random", "urandom")
NEW_ROOT = "/tmp"  # exists everywhere; a tmpfs mounted over it becomes the root
PUT_OLD = "/.old_root"
INSIDE_DIR = "/tmp/sandbox"

libc = ctypes.CDLL(None, use_errno=True)


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None):
    _check(
        libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _unshare_namespaces():
    """Enter new mount, network, pid, IPC and UTS namespaces; False if the kernel refuses.

    IPC: System V shared memory, message queues and semaphores (and POSIX message queues) are per IPC
    namespace, and die with it: nothing one run or tool call leaves there reaches a later one, or the host.
    """
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if os.geteuid() == 0:
        return libc.unshare(flags) == 0
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(flags | CLONE_NEWUSER) != 0:
        return False
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {gid} 1")
    return True


def _bind(source, target, read_only):
    _mount(source, target, None, MS_BIND | MS_REC)
    if read_only:  # a bind mount takes MS_RDONLY only on a remount
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _pivot_root(new_root, put_old):
    number = PIVOT_ROOT_SYSCALL.get(os.uname().machine)
    if number is None:
        raise OSError(0, f"pivot_root: no syscall number known for {os.uname().machine}")
    _check(libc.syscall(ctypes.c_long(number), new_root.encode(), put_old.encode()), "pivot_root")


def _minimal_root(work_dir, python_prefix):
    """Make the root a read-only tmpfs holding only the system's programs and libraries (read-only),
    harmless devices, the work dir at INSIDE_DIR, the interpreter's prefix at its own path (read-only;
    so its RUNPATH finds its own libpython) and a fresh /proc. The host's other files (datasets with
    their answers, the trainer's code, home directories, the world-writable /tmp) are not in it."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    binds = {INSIDE_DIR: (work_dir, False)}
    if not any(python_prefix == path or python_prefix.startswith(path + "/") for path in SYSTEM_DIRS):
        binds[python_prefix] = (python_prefix, True)
    # opened before the new root covers /tmp, where the work dir usually is
    fds = {target: os.open(source, os.O_RDONLY | os.O_DIRECTORY) for target, (source, _) in binds.items()}
    _mount("tmpfs", NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path in SYSTEM_DIRS:
        if os.path.islink(path):  # merged /usr: /lib -> usr/lib
            os.symlink(os.readlink(path), NEW_ROOT + path)
        elif os.path.isdir(path):
            os.mkdir(NEW_ROOT + path)
            _bind(path, NEW_ROOT + path, read_only=True)
    for path in ("/dev", "/proc", "/tmp", PUT_OLD):
        os.mkdir(NEW_ROOT + path, 0o755)
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            open(f"{NEW_ROOT}/dev/{name}", "w").close()
            _bind(f"/dev/{name}", f"{NEW_ROOT}/dev/{name}", read_only=False)
    for target, fd in fds.items():
        os.makedirs(NEW_ROOT + target, 0o755, exist_ok=True)
        _bind(f"/proc/self/fd/{fd}", NEW_ROOT + target, read_only=binds[target][1])
        os.close(fd)
    # this pid namespace's /proc, mounted while the host's is still visible: without root,
    # the kernel allows a new proc only beside a fully visible one
    _mount("proc", NEW_ROOT + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _pivot_root(NEW_ROOT, NEW_ROOT + PUT_OLD)
    os.chdir("/")
    _check(libc.umount2(PUT_OLD.encode(), MNT_DETACH), "umount the old root")
    os.rmdir(PUT_OLD)
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _redirect_outputs(config):
    """The result channel (a file the verifier opened) at RESULT_FD; stderr to /dev/null if asked."""
    if config.get("result_fd") is not None and config["result_fd"] != RESULT_FD:
        os.dup2(config["result_fd"], RESULT_FD)  # inheritable: the program keeps it across execve
        os.close(config["result_fd"])
    if config.get("discard_stderr"):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)


def _exec_program(config, isolated):
    limits = config["limits"]
    argv = list(config["argv"])
    if isolated:
        argv[0] = os.path.join(config["python_prefix"], config["python_in_prefix"])  # the real file, not a venv link
    cwd = INSIDE_DIR if isolated else config["dir"]
    if isolated and os.geteuid() == 0 and config.get("uid") is not None:
        os.setgroups([])
        os.setgid(config["uid"])
        os.setuid(config["uid"])
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # cleared by setuid, so set again here
    mib = 1024 * 1024
    for rlimit, value in (
        (resource.RLIMIT_CPU, limits["cpu_s"]),
        (resource.RLIMIT_AS, limits["memory_mb"] * mib),
        (resource.RLIMIT_FSIZE, limits["file_size_mb"] * mib),
        (resource.RLIMIT_NPROC, limits["max_processes"]),
        (resource.RLIMIT_NOFILE, limits["max_open_files"]),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(rlimit, (value, value))
    os.chdir(cwd)
    _redirect_outputs(config)
    os.execve(argv[0], argv, {**config["env"], "HOME": cwd, "TMPDIR": cwd})


def _wait_for(pid):
    """Wait for ``pid`` (reaping any other child meanwhile); its status as an exit code."""
    while True:
        done, status = os.waitpid(-1, 0)
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code


def _status(config, line, also_stderr=True):
    """Say ``line`` on the status channel (``config["status_fd"]``; stderr without one), and on stderr for a
    reader of the logs when ``also_stderr``."""
    fd = config.get("status_fd")
    if fd is not None:
        os.write(fd, (line + "\n").encode())
    if fd is None or also_stderr:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _join_cgroup(config):
    """Move this process into the run's memory cgroup; False (and a message) if that fails."""
    procs_file = config["cgroup_procs"]
    try:
        with open(procs_file, "w") as f:
            f.write(str(os.getpid()))
        return True
    except OSError as exc:
        _status(config, f"{UNAVAILABLE_MARK}: cannot join the sandbox memory cgroup {procs_file}: {exc}")
        return False


def main():
    config = json.loads(sys.argv[1])
    if config.get("status_fd") is not None:
        os.set_inheritable(config["status_fd"], False)  # closed on execve: the program never holds it
    if config.get("cgroup_procs") and not _join_cgroup(config):
        sys.exit(EXIT_UNAVAILABLE)
    work_dir = config["dir"]
    if os.geteuid() == 0 and config.get("uid") is not None:  # only used when isolated
        os.chown(work_dir, config["uid"], config["uid"])
    isolated = _unshare_namespaces()
    if not isolated and not config["allow_unisolated"]:
        _status(
            config,
            f"{UNAVAILABLE_MARK}: cannot create network/pid/mount namespaces here "
            f"(errno {ctypes.get_errno()}: {os.strerror(ctypes.get_errno())}); "
            "run as root or enable unprivileged user namespaces, or allow an unisolated sandbox",
        )
        sys.exit(EXIT_UNAVAILABLE)
    if not isolated:
        _status(config, UNISOLATED_MARK, also_stderr=False)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the verifier's process
    alive_r, alive_w = os.pipe()  # closes when the launcher dies: init's check for a lost race
    init = os.fork()
    if init:
        os.close(alive_r)
        sys.exit(_wait_for(init))
    # init: pid 1 of the new pid namespace when isolated. A fork does not inherit
    # PDEATHSIG, so set it again; if the launcher died before that, the pipe says so.
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # pid 1 already is one; unisolated, this keeps orphans ours
    os.close(alive_w)
    os.set_blocking(alive_r, False)
    try:
        if os.read(alive_r, 1) == b"":
            os._exit(EXIT_UNAVAILABLE)
    except BlockingIOError:
        pass  # the launcher is alive
    os.close(alive_r)
    try:
        if isolated:
            _minimal_root(work_dir, config["python_prefix"])
    except OSError as exc:
        _status(config, f"{UNAVAILABLE_MARK}: {exc}")
        os._exit(EXIT_UNAVAILABLE)
    program = os.fork()
    if program == 0:
        report = os.dup(2)  # not inherited by the program; stderr itself may go to /dev/null
        try:
            _exec_program(config, isolated)
        except BaseException as exc:  # noqa: BLE001 - report, then leave without running the program
            os.write(report, f"sandbox: could not start the program: {type(exc).__name__}: {exc}\n".encode())
        os._exit(127)
    os._exit(_wait_for(program))


if __name__ == "__main__":
    main()
