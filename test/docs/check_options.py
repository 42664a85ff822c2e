#!/usr/bin/env python3
"""Checks that a generated program's --help and docs/runtime.md's "Options"
table name the same options.

usage: check_options.py HELP_TEXT_FILE DOC.md

The options of --help are the `--name` words of its usage line and of the
lines that start with two spaces and an option; the document's are the
`--name` words in the first column of the table under its "## Options"
heading. Prints one line per option missing on either side and a summary;
exit code 1 if any is missing.
"""
import re
import sys

OPTION = re.compile(r"--[a-z][a-z0-9-]*")


def help_options(text):
    found = set()
    for line in text.splitlines():
        if line.startswith("usage:"):
            found.update(OPTION.findall(line))
        m = re.match(r"^  (--[a-z][a-z0-9-]*)", line)
        if m:
            found.add(m.group(1))
    return found


def doc_options(text):
    found, inside = set(), False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line.strip() == "## Options"
            continue
        if inside and line.startswith("| ") and not line.startswith("|---"):
            first = line.split(" | ")[0]
            found.update(OPTION.findall(first))
    return found


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    helped = help_options(open(sys.argv[1]).read())
    documented = doc_options(open(sys.argv[2]).read())
    doc = sys.argv[2].split("/")[-1]
    if not helped:
        sys.exit("check_options.py: no option found in the --help text")
    if not documented:
        sys.exit("check_options.py: no '## Options' table in " + doc)
    for o in sorted(helped - documented):
        print(f"{doc}: {o} is in --help but not in the Options table")
    for o in sorted(documented - helped):
        print(f"{doc}: {o} is in the Options table but not in --help")
    bad = len(helped ^ documented)
    print(f"{doc}: {len(helped)} options in --help, {len(documented)} in the "
          f"table, {bad} differences")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
