#!/usr/bin/env python3
"""Writes the man pages zrtier.1 and zrtier-top.1 from the programs themselves: every command's and
subcommand's --help, the option table (`zrtier options`), the version. The build runs it after
linking the tools, so the pages always describe the binaries they are installed with.

    scripts/gen-man.py build/tools/zrtier build/tools/zrtier-top OUTDIR
"""
import re
import subprocess
import sys


def run(*argv):
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env={"NO_COLOR": "1"})
    return out.stdout


def esc(text):
    """Roff-escapes plain text: backslashes, and a leading . or ' that would start a request."""
    text = text.replace("\\", "\\e")
    return "\n".join(("\\&" + line if line[:1] in ".'" else line) for line in text.split("\n"))


def pre(text):
    """A block shown as printed (the programs' own --help layout)."""
    return ".nf\n" + esc(text.rstrip("\n")) + "\n.fi\n"


def subcommands(help_text):
    """The subcommand names of a CLI11 help text's "Subcommands:" section."""
    names, inside = [], False
    for line in help_text.split("\n"):
        if line.startswith("Subcommands:"):
            inside = True
            continue
        if inside:
            m = re.match(r"  (\S+)\s", line)
            if m:
                names.append(m.group(1))
            elif line.strip() and not line.startswith(" "):
                break
    return names


def usage_path(text, binary, name):
    """CLI11 prints the program as it was invoked; the page names it plainly."""
    return text.replace(binary, name)


def header(name, version, summary):
    return (f'.TH {name.upper()} 1 "" "{esc(version)}" "User Commands"\n'
            f".SH NAME\n{name} \\- {esc(summary)}\n")


def zrtier_page(binary, version):
    top_help = usage_path(run(binary, "--help"), binary, "zrtier")
    out = [header("zrtier", version, "virtual pinned memory for unmodified CUDA programs")]
    out.append(".SH SYNOPSIS\n.B zrtier run\n[\\fIOPTIONS\\fR] \\-\\- \\fICOMMAND\\fR [\\fIARGS\\fR...]\n.br\n"
               ".B zrtier\n\\fISUBCOMMAND\\fR [\\fIOPTIONS\\fR]\n.br\n"
               ".B LD_PRELOAD=\\fI/path/to/\\fBlibzrtier.so\\fR \\fICOMMAND\\fR\n")
    out.append(".SH DESCRIPTION\n"
               "zrtier lets unmodified CUDA programs (PyTorch among them) use more pinned host memory "
               "than the machine could pin. Its library, libzrtier.so, preloaded into a program, "
               "intercepts pinned host allocations (cudaHostAlloc and friends) and backs them with "
               "memory it manages: pinned in place while a memory budget allows, otherwise resident "
               "and compressed in RAM, a zram device or spill files, brought back ahead of the copies "
               "that need it. The program's results are bit-identical to a run without it.\n"
               ".PP\nThe zrtier command runs programs under the library and inspects, tests and "
               "benchmarks it.\n")
    out.append(".SH COMMANDS\n")
    for sub in subcommands(top_help):
        text = usage_path(run(binary, sub, "--help"), binary, "zrtier")
        out.append(f".SS zrtier {sub}\n" + pre(text))
        for subsub in subcommands(text):
            t = usage_path(run(binary, sub, subsub, "--help"), binary, "zrtier")
            out.append(f".SS zrtier {sub} {subsub}\n" + pre(t))
    out.append(".SH ENVIRONMENT\nEvery option is a ZRTIER_* environment variable read by libzrtier.so "
               "when the program starts; zrtier run sets them from its flags. The table "
               "(zrtier options):\n" + pre(run(binary, "options")))
    out.append(".SH EXIT STATUS\nzrtier run exits with the status of \\fICOMMAND\\fR (128+N if it died of "
               "signal N, 127 if it was not found, 126 if it could not be run), 69 when zrtier is "
               "required (\\-\\-require, ZRTIER_REQUIRE=1) and cannot start, and 2 for bad usage. "
               "Other commands exit 0 on success, 1 when what they report failed and 2 for bad usage.\n")
    out.append(".SH FILES\n.TP\n/dev/shm/zrtier.\\fIPID\\fR\nthe statistics block of a process under zrtier "
               "(mode 0600), read by zrtier stats and zrtier\\-top\n"
               ".TP\n/run/zrtier/\nrecords of the zram devices zrtier claimed (reaped when their owner is gone)\n"
               ".TP\n/var/tmp/zrtier\\-\\fIUID\\fR/\nthe default folder of spill files (ZRTIER_SPILL_DIR), one per user; the files "
               "are unlinked as soon as they are open\n")
    out.append(".SH SEE ALSO\n.BR zrtier\\-top (1)\n")
    return "".join(out)


def top_page(binary, version):
    text = usage_path(run(binary, "--help"), binary, "zrtier-top")
    out = [header("zrtier-top", version, "live view of every process running under zrtier")]
    out.append(".SH SYNOPSIS\n.B zrtier\\-top\n[\\fIOPTIONS\\fR]\n")
    out.append(".SH DESCRIPTION\nzrtier\\-top shows, for every process running under zrtier, where its "
               "managed memory is (pinned, resident, compressed, spilled), the memory budget, copy and "
               "fault rates, and what the process would have pinned without zrtier. It reads the "
               "statistics blocks the processes publish; it needs no privileges beyond reading them.\n")
    out.append(".SH OPTIONS\n" + pre(text))
    out.append(".SH ENVIRONMENT\n.TP\nNO_COLOR\nwhen set, no colours\n")
    out.append(".SH FILES\n.TP\n/dev/shm/zrtier.\\fIPID\\fR\nthe statistics blocks it reads\n")
    out.append(".SH SEE ALSO\n.BR zrtier (1)\n")
    return "".join(out)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    zrtier, top, outdir = sys.argv[1:]
    version = run(zrtier, "--version").strip() or "zrtier"
    with open(f"{outdir}/zrtier.1", "w") as f:
        f.write(zrtier_page(zrtier, version))
    with open(f"{outdir}/zrtier-top.1", "w") as f:
        f.write(top_page(top, version))


if __name__ == "__main__":
    main()
