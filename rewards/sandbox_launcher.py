"""Sandbox launcher, run as a plain script: ``python -I -S sandbox_launcher.py CONFIG_JSON``.

Started by :func:`hybridflow.rewards.sandbox.run_python` (which documents
the guarantees); standard library only, imports nothing from hybridflow.
Steps, in this order because each needs the privileges the next one drops::

    launcher (root)    chown the work dir to a fresh uid; unshare(mount, network, pid
                       namespaces); die with the verifier process (PDEATHSIG); fork
    └─ init (pid 1)    PDEATHSIG (dies with the launcher); private mounts: read-only
                       empty tmpfs over /tmp /var/tmp /dev/shm /run/lock, the work dir
                       bound at /tmp/sandbox, the interpreter's prefix bound at
                       /tmp/.python, a fresh /proc; fork; wait
       └─ program      setgroups([]) setgid setuid(fresh uid); no_new_privs;
                       PDEATHSIG; rlimits; chdir; execve(python -I main.py)

When init exits (the program ended, or the launcher was killed and init got
its PDEATHSIG), the kernel kills every process left in the pid namespace:
nothing the program forked survives it. Without root, a user namespace
provides the same namespaces (if the kernel allows it), without the uid
change. When no namespace can be made, the launcher exits with
:data:`EXIT_UNAVAILABLE` unless the config allows running unisolated.
"""

import ctypes
import json
import os
import resource
import signal
import sys

EXIT_UNAVAILABLE = 71
UNAVAILABLE_MARK = "HYBRIDFLOW_SANDBOX_UNAVAILABLE"
UNISOLATED_MARK = "HYBRIDFLOW_SANDBOX_UNISOLATED"
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
MASKED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
INSIDE_DIR = "/tmp/sandbox"
INSIDE_PYTHON = "/tmp/.python"

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
    """Enter new mount, network and pid namespaces; False if the kernel refuses."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
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


def _private_mounts(work_dir, python_prefix):
    """Mask the world-writable dirs; bind the work dir and the interpreter's prefix
    (which may sit under an unreadable home) where the program's uid can reach them."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    binds = {INSIDE_DIR: work_dir, INSIDE_PYTHON: python_prefix}
    fds = {target: os.open(source, os.O_RDONLY | os.O_DIRECTORY) for target, source in binds.items()}  # before masking
    for path in MASKED_DIRS:
        if os.path.isdir(path) and not os.path.islink(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for target, fd in fds.items():
        os.mkdir(target, 0o755)
        _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        os.close(fd)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _exec_program(config, isolated):
    limits = config["limits"]
    argv = list(config["argv"])
    if isolated:
        argv[0] = os.path.join(INSIDE_PYTHON, config["python_in_prefix"])
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
    os.execve(argv[0], argv, {**config["env"], "HOME": cwd, "TMPDIR": cwd})


def _wait_for(pid):
    """Wait for ``pid`` (reaping any other child meanwhile); its status as an exit code."""
    while True:
        done, status = os.waitpid(-1, 0)
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code


def main():
    config = json.loads(sys.argv[1])
    work_dir = config["dir"]
    if os.geteuid() == 0 and config.get("uid") is not None:  # only used when isolated
        os.chown(work_dir, config["uid"], config["uid"])
    isolated = _unshare_namespaces()
    if not isolated and not config["allow_unisolated"]:
        sys.stderr.write(f"{UNAVAILABLE_MARK}: cannot create network/pid/mount namespaces here "
                         f"(errno {ctypes.get_errno()}: {os.strerror(ctypes.get_errno())}); "
                         "run as root or enable unprivileged user namespaces, or allow an unisolated sandbox\n")
        sys.exit(EXIT_UNAVAILABLE)
    if not isolated:
        sys.stderr.write(UNISOLATED_MARK + "\n")
        sys.stderr.flush()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the verifier's process
    alive_r, alive_w = os.pipe()  # closes when the launcher dies: init's check for a lost race
    init = os.fork()
    if init:
        os.close(alive_r)
        sys.exit(_wait_for(init))
    # init: pid 1 of the new pid namespace when isolated. A fork does not inherit
    # PDEATHSIG, so set it again; if the launcher died before that, the pipe says so.
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
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
            _private_mounts(work_dir, config["python_prefix"])
    except OSError as exc:
        sys.stderr.write(f"{UNAVAILABLE_MARK}: {exc}\n")
        os._exit(EXIT_UNAVAILABLE)
    program = os.fork()
    if program == 0:
        try:
            _exec_program(config, isolated)
        except BaseException as exc:  # noqa: BLE001 - report, then leave without running the program
            sys.stderr.write(f"sandbox: could not start the program: {type(exc).__name__}: {exc}\n")
            sys.stderr.flush()
        os._exit(127)
    os._exit(_wait_for(program))


if __name__ == "__main__":
    main()
