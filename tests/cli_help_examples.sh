#!/bin/sh
# cli_help_examples.sh ATTN DIR: runs the example that `attn COMMAND --help` prints, for every
# command, in a fresh DIR/COMMAND, exactly as printed except that `attn` is the binary ATTN and
# `python3` is Debian's /usr/bin/python3 (which has numpy). Exits 77 (skipped) without numpy.
set -eu
attn=$1
root=$2
/usr/bin/python3 -c "import numpy" 2>/dev/null || { echo "numpy is not available: skipped"; exit 77; }
for command in softmax sdpa additive nw kreg demo; do
  rm -rf "$root/$command"
  mkdir -p "$root/$command"
  # The lines after "Example...:" up to the end of the help text, with the programs replaced.
  "$attn" "$command" --help | sed -n '/^Example/,$p' | tail -n +2 |
    sed -e "s#^\( *\)attn #\1\"$attn\" #" -e "s#^\( *\)python3 #\1/usr/bin/python3 #" >"$root/$command/example.sh"
  echo "== attn $command --help example:"
  cat "$root/$command/example.sh"
  (cd "$root/$command" && sh -e example.sh >output.txt) || { echo "FAILED: the example of attn $command"; exit 1; }
done
# What the examples promise to write.
for f in softmax/W.npy sdpa/O.npy sdpa/W.npy sdpa/W.png additive/O.npy additive/W.svg nw/YHAT.npy nw/fit.png \
         kreg/YHAT.npy kreg/LOW.npy kreg/HIGH.npy kreg/fit.png demo/pictures/nadaraya-watson.png \
         demo/pictures/local-linear.png; do
  test -s "$root/$f" || { echo "FAILED: the example did not write $f"; exit 1; }
done
echo "every example ran"
