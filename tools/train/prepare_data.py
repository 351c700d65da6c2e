#!/usr/bin/env python3
"""Prepares the King James Bible text for training (standard library only).

Source: Debian's `bible-kjv` program and its `bible-kjv-text` data (the KJV
text's copyright has expired; see /usr/share/doc/bible-kjv-text/copyright).
`bible -f "Gen1:1-Rev22:21"` prints all 31,102 verses, one a line, each
prefixed with its reference ("Ge1:1 In the beginning ...").

Output (deterministic: the same package version gives the same bytes):
  train.txt    every book except the held-out ones, minus the validation chapters
  valid.txt    every 50th chapter of the training books (chapter index % 50 == 25):
               used during training to pick the best checkpoint
  heldout.txt  the held-out books, never trained on nor used for any choice:
               Ruth, Esther, Jonah, Habakkuk, Philippians (narrative, narrative,
               prophetic narrative, poetic prophecy, epistle)
  manifest.json  counts and the package version

Format: one verse per line with the reference stripped and runs of spaces
collapsed; a blank line between chapters.

Usage: python3 tools/train/prepare_data.py [OUT_DIR]   (default .train-data)
Installs bible-kjv with apt-get when the `bible` program is missing.
"""
import json
import os
import re
import shutil
import subprocess
import sys

HELDOUT_BOOKS = ("Ruth", "Est", "Jonah", "Hab", "Phi")   # the program's abbreviations
VALID_EVERY, VALID_AT = 50, 25
EXPECTED_VERSES = 31102
REF = re.compile(r"^([1-3]?[A-Za-z]+)([0-9]+):([0-9]+) (.*)$")


def ensure_bible():
    if shutil.which("bible"):
        return
    print("prepare_data: installing bible-kjv (apt-get)", file=sys.stderr)
    subprocess.run(["apt-get", "install", "-y", "bible-kjv"], check=True,
                   stdout=subprocess.DEVNULL)
    if not shutil.which("bible"):
        sys.exit("prepare_data: the 'bible' program is still missing after installing bible-kjv")


def package_version():
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "bible-kjv-text"],
                             check=True, capture_output=True, text=True).stdout
        return out.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def read_verses():
    """Yields (book, chapter, verse, text) for every verse, in canonical order."""
    raw = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True,
                         capture_output=True).stdout.decode("ascii")
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        m = REF.match(line)
        if not m:
            sys.exit(f"prepare_data: line {n} has no verse reference: {line[:60]!r}")
        text = " ".join(m.group(4).split())
        yield m.group(1), int(m.group(2)), int(m.group(3)), text


def split_chapters(verses):
    """Groups verses into chapters: a list of (book, chapter, [texts])."""
    chapters = []
    for book, ch, _, text in verses:
        if not chapters or chapters[-1][0] != book or chapters[-1][1] != ch:
            chapters.append((book, ch, []))
        chapters[-1][2].append(text)
    return chapters


def write_text(path, chapters):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n\n".join("\n".join(texts) for _, _, texts in chapters))
        f.write("\n")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else ".train-data"
    ensure_bible()
    verses = list(read_verses())
    if len(verses) != EXPECTED_VERSES:
        sys.exit(f"prepare_data: expected {EXPECTED_VERSES} verses, got {len(verses)}")
    chapters = split_chapters(verses)
    books = {b for b, _, _ in chapters}
    missing = [b for b in HELDOUT_BOOKS if b not in books]
    if missing:
        sys.exit(f"prepare_data: held-out books not found: {missing}")

    heldout = [c for c in chapters if c[0] in HELDOUT_BOOKS]
    rest = [c for c in chapters if c[0] not in HELDOUT_BOOKS]
    valid = [c for i, c in enumerate(rest) if i % VALID_EVERY == VALID_AT]
    train = [c for i, c in enumerate(rest) if i % VALID_EVERY != VALID_AT]

    os.makedirs(out, exist_ok=True)
    files = {"train.txt": train, "valid.txt": valid, "heldout.txt": heldout}
    manifest = {"source": "bible -f Gen1:1-Rev22:21 (Debian bible-kjv, bible-kjv-text "
                          + package_version() + ")",
                "heldout_books": list(HELDOUT_BOOKS),
                "valid_chapters": f"index % {VALID_EVERY} == {VALID_AT} among the training books"}
    for name, chs in files.items():
        path = os.path.join(out, name)
        write_text(path, chs)
        manifest[name] = {"chapters": len(chs), "verses": sum(len(c[2]) for c in chs),
                          "bytes": os.path.getsize(path)}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    for name in files:
        m = manifest[name]
        print(f"prepare_data: {out}/{name}: {m['chapters']} chapters, {m['verses']} verses, "
              f"{m['bytes']} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
