#!/usr/bin/env python3
"""Checks the ```plan examples of a Markdown document against planc.

Usage: check_doc_examples.py [--planc PATH] DOC.md

Every fenced code block whose info string is exactly `plan` is an example.
Blocks tagged `plan-fragment` (or anything else) are not checked.

An example may be preceded, on the lines directly above its opening fence
(no blank line in between), by marker comments, one per line:

  <!-- file: models/x.plan -->   write the block to this path (relative to a
                                 scratch directory) so that other examples
                                 can `import "models/x.plan"`; a file block
                                 is a library and is not compiled by itself
                                 unless another marker below asks for it
  <!-- error: TEXT -->           planc must exit with code 1 and print TEXT
                                 on stderr
  <!-- warning: TEXT -->         planc must succeed and print TEXT on stderr
                                 (a warning or a remark)
  <!-- ir: TEXT -->              planc must succeed and print TEXT in the IR
                                 on stdout (may be repeated)
  <!-- flags: --mlir-debuginfo --> extra planc arguments (a --stage=PASS
                                 among them replaces --stage=parse)

An example without markers is a complete plan that must compile silently
(exit code 0, nothing on stderr). Each check runs

  planc /abs/path/FILE --emit=mlir --stage=parse [flags]

after every block has been written, so a block may import a file that the
document defines further down. Unnamed blocks are written to the top of the
scratch directory as example-L<line>.plan, where <line> is the line of the
opening fence in the document. The script prints one line per failure and
exits 1 if any example fails (or if the document has no example at all).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

MARKER = re.compile(r"^\s*<!--\s*([a-z]+)\s*(?::\s*(.*?))?\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)\s*$")
KEYS = {"file", "error", "warning", "ir", "flags"}


def extract(lines):
    """Yields (line number, markers, text) for each ```plan block."""
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(2), m.group(3), i
        body = []
        i += 1
        while i < len(lines) and not (
                lines[i].strip().startswith(fence[0] * len(fence))
                and lines[i].strip().strip(fence[0]) == ""):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if info != "plan":
            continue
        markers = []
        j = start - 1
        while j >= 0:
            mm = MARKER.match(lines[j])
            if not mm:
                break
            markers.insert(0, (mm.group(1), mm.group(2) or "", j + 1))
            j -= 1
        yield start + 1, markers, "".join(body)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--planc", default="planc")
    ap.add_argument("doc")
    args = ap.parse_args()
    with open(args.doc, encoding="utf-8") as f:
        lines = f.readlines()
    doc = os.path.basename(args.doc)
    failures = []
    examples = list(extract(lines))
    if not examples:
        print(f"{doc}: no ```plan examples found")
        return 1

    with tempfile.TemporaryDirectory() as tmp:
        checks = []
        for line, markers, text in examples:
            where = f"{doc}:{line}"
            name = f"example-L{line}.plan"
            named = False
            expect = {"error": [], "warning": [], "ir": [], "flags": []}
            for key, value, mline in markers:
                if key not in KEYS:
                    failures.append(f"{doc}:{mline}: unknown marker '{key}'")
                elif key == "file":
                    if (not value or os.path.isabs(value)
                            or ".." in value.split("/")):
                        failures.append(
                            f"{doc}:{mline}: 'file' needs a relative path")
                        continue
                    name, named = value, True
                else:
                    expect[key].append(value)
            path = os.path.join(tmp, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.exists(path):
                failures.append(f"{where}: file '{name}' is written twice")
            with open(path, "w", encoding="utf-8") as out:
                out.write(text)
            if expect["error"] and (expect["warning"] or expect["ir"]):
                failures.append(f"{where}: an error example cannot also "
                                "expect a warning or IR")
                continue
            if named and not (expect["error"] or expect["warning"]
                              or expect["ir"]):
                continue  # a library file, imported by other examples
            checks.append((where, path, expect))

        for where, path, expect in checks:
            flags = " ".join(expect["flags"]).split()
            stage = [] if any(f.startswith("--stage") for f in flags) else [
                "--stage=parse"]
            cmd = [args.planc, path, "--emit=mlir"] + stage + flags
            try:
                r = subprocess.run(cmd, capture_output=True, text=True,
                                   timeout=120)
            except (OSError, subprocess.TimeoutExpired) as e:
                failures.append(f"{where}: could not run planc: {e}")
                continue
            stderr = r.stderr.strip()
            first = stderr.splitlines()[0] if stderr else ""
            if expect["error"]:
                if r.returncode != 1:
                    failures.append(f"{where}: expected exit code 1, got "
                                    f"{r.returncode}")
                for text in expect["error"]:
                    if text not in r.stderr:
                        failures.append(f"{where}: expected the error '{text}'"
                                        f", got: {first or '(no output)'}")
                continue
            if r.returncode != 0:
                failures.append(f"{where}: planc failed (exit code "
                                f"{r.returncode}): {first}")
                continue
            for text in expect["warning"]:
                if text not in r.stderr:
                    failures.append(f"{where}: expected '{text}' on stderr, "
                                    f"got: {first or '(nothing)'}")
            if not expect["warning"] and stderr:
                failures.append(f"{where}: unexpected output on stderr: "
                                f"{first}")
            for text in expect["ir"]:
                if text not in r.stdout:
                    failures.append(f"{where}: expected '{text}' in the IR")

    for f in failures:
        print(f)
    print(f"{doc}: {len(examples)} examples, {len(checks)} checked, "
          f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
