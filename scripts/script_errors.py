"""The scripts' one boundary with the outside world (compare_logs.py, jsonl_log.py, roofline_plot.py,
study_report.py, mock_data_golden.py, bench_torch.py; log_formats.py reads through it). Standard library
only, so any python3 can import it.

  run_main(prog, main, status)   every script's entry point: an input or environment error is one line on
                                 stderr, "<prog>: error: <file or option>: <reason>", and a non-zero exit,
                                 never a traceback; Ctrl-C is one line and exit 130; a closed stdout
                                 (`| head`) ends the script quietly
  ScriptError                    the base of every script's own error class (its `status`: the exit status
                                 when it is not the script's usual one)
  read_regular_file(path, error) the bytes of an input file; a FIFO, a directory, a device or a socket is
                                 refused with one line naming its type, never opened in a way that blocks
  ArgumentParser, positive_int   option errors in one line naming the option; sizes and counts > 0
  import_or_rerun(...)           numpy / matplotlib / torch: missing under this python3 (a venv's, first on
                                 PATH), the script re-runs under Debian's /usr/bin/python3 when that one has
                                 them (scripts/setup.sh installs them there), else one line saying what to
                                 install
A programming error is not caught here: it still shows its traceback.
"""

import argparse
import codecs
import importlib
import os
import re
import stat
import subprocess
import sys

SYSTEM_PYTHON = "/usr/bin/python3"
# Set (to the script's path) in the environment of a script re-run under SYSTEM_PYTHON: that run never
# re-runs itself again, whatever it finds (no exec loop).
RERUN_MARKER = "PL_SCRIPT_RERUN"
DEBIAN_PACKAGES = {"numpy": "python3-numpy", "matplotlib": "python3-matplotlib", "torch": "python3-torch"}
# The status a shell reports for a program ended by SIGPIPE (128 + 13): what `cmd | head` shows for a C tool.
BROKEN_PIPE_STATUS = 141
INTERRUPTED_STATUS = 130


class ScriptError(Exception):
    """An input or environment error: run_main prints it as one line. `status`: None for the script's usual
    error status, else the exit status this kind of error has."""

    status = None


class MissingModule(ScriptError):
    """A module the script needs is not installed for this python3 nor for SYSTEM_PYTHON."""


def file_kind(mode):
    """'a FIFO', 'a directory', ... for a stat mode: the words of the C++ tools' message (lib/io/file_checks.cpp)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def os_reason(e):
    """An OSError's reason in words, without Python's '[Errno N]' prefix."""
    return e.strerror or str(e)


def open_regular_file(path, error):
    """A descriptor of the regular file `path`. O_NONBLOCK: open(2) of a FIFO for reading otherwise waits
    for a writer, forever; the descriptor that fstat checked is the one read, so nothing can be swapped in
    under the name between the check and the read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        # A socket cannot be opened at all (ENXIO): name its type rather than "no such device or address".
        try:
            mode = os.stat(path).st_mode
        except OSError:
            mode = None
        if mode is not None and not stat.S_ISREG(mode):
            raise error(f"{path}: is {file_kind(mode)}, not a regular file")
        raise error(f"{path}: cannot read: {os_reason(e)}")
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{path}: is {file_kind(mode)}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular_file(path, error):
    """The bytes of the regular file `path`; anything else, or a read that fails, raises error("PATH: why")."""
    fd = open_regular_file(path, error)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    except OSError as e:
        raise error(f"{path}: cannot read: {os_reason(e)}")
    finally:
        os.close(fd)


# ---- options ------------------------------------------------------------------------------------------

class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with its errors in one line ("<prog>: error: argument --gpus: ..."), exit 2, without
    the usage lines argparse prints before them (--help prints those)."""

    def error(self, message):
        print_line(f"{self.prog}: error: {message} (see --help)")
        sys.exit(2)


def positive_int(text):
    """argparse type of every size or count option: a decimal integer > 0 ('0', '-5', '1.5', 'x' refused,
    argparse names the option). Plain ASCII digits only: str.isdigit() also accepts '²', which int() does not."""
    if not re.fullmatch(r"\s*\+?[0-9]+\s*", text) or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not '{text}'")
    return int(text)


# ---- the entry point ----------------------------------------------------------------------------------

def print_line(text):
    """One line on stderr; a stderr that is gone too is not a second error."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def warn(prog, message):
    print_line(f"{prog}: warning: {message}")


def os_error_text(e):
    """'FILE: reason' for an OSError that names its file, else the reason."""
    return f"{e.filename}: {os_reason(e)}" if e.filename else os_reason(e)


def escape_unencodable(e):
    """Codec error handler of stdout: a file name's undecodable bytes (U+DC80..U+DCFF, Python's
    surrogateescape) are written back as the bytes they were, anything else the encoding cannot take (a
    lone surrogate from a JSON string's \\ud800) as a backslash escape, so printing never raises."""
    if not isinstance(e, UnicodeEncodeError):
        raise e
    out = []
    for ch in e.object[e.start:e.end]:
        c = ord(ch)
        out.append(bytes([c - 0xDC00]) if 0xDC80 <= c <= 0xDCFF else ch.encode("ascii", "backslashreplace"))
    return b"".join(out), e.end


codecs.register_error("script_errors.escape", escape_unencodable)


def silence_stdout():
    """After EPIPE on stdout: Python flushes stdout once more at exit and would print 'Exception ignored ...
    BrokenPipeError'; /dev/null in its place takes what is left."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def run_main(prog, main, status=1):
    """Runs main() and exits with what it returns. ScriptError and OSError: one line, exit e.status or
    `status` (the script's error status); Ctrl-C: one line, exit 130; EPIPE on stdout: no line, exit 141."""
    try:
        # Text the locale cannot encode (a lone surrogate from a JSON string) is written escaped rather than
        # raising UnicodeEncodeError half-way through a table.
        if hasattr(sys.stdout, "reconfigure"):
            sys.stdout.reconfigure(errors="script_errors.escape")
        code = main()
        sys.stdout.flush()  # a closed pipe shows here, inside the boundary, not at interpreter exit
    except KeyboardInterrupt:
        print_line(f"{prog}: interrupted")
        code = INTERRUPTED_STATUS
    except BrokenPipeError:
        silence_stdout()
        code = BROKEN_PIPE_STATUS
    except ScriptError as e:
        print_line(f"{prog}: error: {e}")
        code = e.status if e.status is not None else status
    except OSError as e:
        print_line(f"{prog}: error: {os_error_text(e)}")
        code = status
    sys.exit(code)


# ---- the python3 that has numpy -----------------------------------------------------------------------

def missing_module(names):
    """The first of the modules `names` this interpreter cannot import, or None."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return None


def system_python_has(names):
    probe = [SYSTEM_PYTHON, "-c", "import " + ", ".join(names)]
    try:
        return subprocess.run(probe, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def running_as_script(script):
    """Whether this process runs `script` itself (not a program that imported it: never exec'd away)."""
    return bool(sys.argv and sys.argv[0]) and os.path.realpath(sys.argv[0]) == os.path.realpath(script)


def rerun_under_system_python(script, argv, names):
    """Replaces this process by `SYSTEM_PYTHON script argv...` when that python3 imports every module of
    `names` (scripts/script_util.sh's find_python makes the same choice). Returns when it cannot: not run as
    a script, already a re-run, or SYSTEM_PYTHON missing or without them."""
    script = os.path.realpath(script)
    if os.environ.get(RERUN_MARKER) == script or not running_as_script(script) \
            or not os.access(SYSTEM_PYTHON, os.X_OK) or not system_python_has(names):
        return
    os.environ[RERUN_MARKER] = script
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # what was printed so far, before this process image is replaced
    os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, script, *(sys.argv[1:] if argv is None else argv)])


def import_or_rerun(script, argv, *names):
    """The modules `names` (e.g. "numpy", "matplotlib"), imported. When one is missing here, the script re-runs
    under SYSTEM_PYTHON with the same arguments if that one has them all (this call then never returns);
    else MissingModule("needs numpy (Debian: apt-get install python3-numpy)"). `argv`: main's argument
    list (None: sys.argv[1:])."""
    missing = missing_module(names)
    if missing is not None:
        rerun_under_system_python(script, argv, names)
        package = DEBIAN_PACKAGES.get(missing, "python3-" + missing)
        raise MissingModule(f"needs {missing} (Debian: apt-get install {package})")
    return [importlib.import_module(name) for name in names]
