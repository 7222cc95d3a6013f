# Installs a carried package folder on the GPU machine. Template: `python -m calibrate.carry.pack`
# copies it into .carry-a/ and .carry-b/, the two libraries' paths filled in. Sourced, from the
# repository root, so that PYTHONPATH stays set for the rest of the device command:
#   source .carry-a/setup.sh a || exit 3     (first command)
#   source .carry-b/setup.sh b || exit 3     (second command, same warm machine)
# Stage a installs its wheels and keeps part one of the compressed MLIR compiler in $CARRY_STASH;
# stage b installs its wheels, joins both parts, decompresses the two CuTe DSL libraries, checks
# their sha256 and unpacks the rest. Any missing or corrupt piece: one line on stderr, status 1.
# CARRY_SITE (default /tmp/site), CARRY_STASH (/tmp/carry) and CARRY_PYTHON (python3) move it.
# No `set -e` or `exit`: either would act on the shell that sources this file.

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "setup.sh: source it (source $0 a|b), so that PYTHONPATH stays set" >&2
  exit 2
fi

_carry_fail() { echo "setup.sh $_carry_stage: $*" >&2; return 1; }

# Decompresses the concatenation of the parts given after OUT into OUT, through a temporary name.
# Python's lzma, not the xz program: the device image need not have xz.
_carry_unxz() {
  "$_carry_py" -c '
import lzma, os, sys
out, parts = sys.argv[1], sys.argv[2:]
names = " + ".join(parts)
d = lzma.LZMADecompressor()
try:
    with open(out + ".part", "wb") as f:
        for p in parts:
            with open(p, "rb") as src:
                while chunk := src.read(1 << 20):
                    if d.eof:
                        sys.exit(f"{p}: data past the end of the compressed stream")
                    f.write(d.decompress(chunk))
except lzma.LZMAError as e:
    sys.exit(f"{names}: corrupt compressed data ({e})")
if not d.eof:
    sys.exit(f"{names}: the compressed data ends early (a part is cut short)")
os.replace(out + ".part", out)
' "$@"
}

_carry_untar() {
  "$_carry_py" -c '
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    t.extractall(sys.argv[2], filter="data")
' "$1" "$2"
}

_carry_install_wheels() {
  set -- "$_carry_dir"/*.whl
  [ -e "$1" ] || return 0
  "$_carry_py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --disable-pip-version-check --root-user-action=ignore --target "$_carry_site" "$@" \
    || _carry_fail "pip could not install the wheels of $_carry_dir into $_carry_site"
}

_carry_main() {
  case "$_carry_stage" in
    a|b) ;;
    *) echo "setup.sh: stage must be a or b, got '$_carry_stage'" >&2; return 2 ;;
  esac
  [ -f "$_carry_dir/MANIFEST.sha256" ] || _carry_fail "$_carry_dir/MANIFEST.sha256 is missing" || return 1
  (cd "$_carry_dir" && sha256sum --quiet --strict -c MANIFEST.sha256 >&2) \
    || _carry_fail "$_carry_dir is incomplete or corrupt (files above); rebuild it with make carry" || return 1
  mkdir -p "$_carry_site" "$_carry_stash" || _carry_fail "cannot create $_carry_site and $_carry_stash" || return 1
  _carry_install_wheels || return 1
  local arc
  for arc in "$_carry_dir"/*_py.tar.xz; do
    [ -e "$arc" ] || continue
    _carry_untar "$arc" "$_carry_site" || _carry_fail "$(basename "$arc") did not unpack" || return 1
  done
  local pp="$_carry_site:$PWD"
  if [ "$_carry_stage" = a ]; then
    cp "$_carry_dir/ir.xz.part1" "$_carry_stash/ir.xz.part1" \
      || _carry_fail "cannot copy ir.xz.part1 to $_carry_stash" || return 1
  else
    local part1="$_carry_stash/ir.xz.part1"
    [ -f "$part1" ] || _carry_fail "$part1 is missing: source .carry-a/setup.sh a first, on this machine" || return 1
    (cd "$_carry_stash" && sha256sum --quiet --strict -c "$_carry_dir/part1.sha256" >&2) \
      || _carry_fail "$part1 is not the part one of this build: source the same build's .carry-a/setup.sh a" || return 1
    mkdir -p "$_carry_site/$(dirname "@IR@")" "$_carry_site/$(dirname "@RUNTIME@")" \
      || _carry_fail "cannot create the libraries' folders in $_carry_site" || return 1
    _carry_unxz "$_carry_site/@IR@" "$part1" "$_carry_dir/ir.xz.part2" \
      || _carry_fail "the MLIR compiler did not decompress" || return 1
    _carry_unxz "$_carry_site/@RUNTIME@" "$_carry_dir/rt.xz" \
      || _carry_fail "the CuTe DSL runtime did not decompress" || return 1
    (cd "$_carry_site" && sha256sum --quiet --strict -c "$_carry_dir/sha.txt" >&2) \
      || _carry_fail "the decompressed libraries' sha256 do not match sha.txt" || return 1
    _carry_untar "$_carry_dir/cu13_small.tar.xz" "$_carry_site" \
      || _carry_fail "cu13_small.tar.xz did not unpack" || return 1
    # the wheel's .pth file names this folder; pip --target leaves .pth files unread
    pp="$_carry_site:$_carry_site/nvidia_cutlass_dsl/dsl_packages:$PWD"
  fi
  export PYTHONPATH="$pp"
  echo "setup.sh $_carry_stage: installed into $_carry_site; PYTHONPATH=$PYTHONPATH" >&2
}

_carry_stage="${1:-}"
_carry_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_carry_site="${CARRY_SITE:-/tmp/site}"
_carry_stash="${CARRY_STASH:-/tmp/carry}"
_carry_py="${CARRY_PYTHON:-python3}"
_carry_main
_carry_rc=$?
unset -f _carry_fail _carry_unxz _carry_untar _carry_install_wheels _carry_main
unset _carry_stage _carry_dir _carry_site _carry_stash _carry_py
return $_carry_rc
