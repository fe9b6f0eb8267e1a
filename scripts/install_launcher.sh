#!/bin/sh
# Writes the `meshnet` launcher `make install` puts on PATH: this checkout's venv, run with the data
# dir `make run` serves from, so the command after `make run` finds the same models, keys and swarm.
# Usage: scripts/install_launcher.sh VENV_MESHNET DATA_DIR LAUNCHER
set -eu
program=$1 data_dir=$2 launcher=$3
for path in "$program" "$data_dir" "$launcher"; do
	case $path in
	/*) ;;
	*) echo "install_launcher: $path is not an absolute path" >&2; exit 2 ;;
	esac
	case $path in
	*"'"*) echo "install_launcher: $path contains a single quote" >&2; exit 2 ;;
	esac
done
mkdir -p "$(dirname "$launcher")"
temporary="$launcher.partial.$$"
cat >"$temporary" <<LAUNCHER
#!/bin/sh
# meshnet, installed by \`make install\`: this checkout's venv, with the data dir \`make run\` uses.
# A --data-dir given on the command line comes later and wins.
exec '$program' --data-dir '$data_dir' "\$@"
LAUNCHER
chmod 755 "$temporary"
mv -f "$temporary" "$launcher"
echo "installed $launcher (runs $program --data-dir $data_dir)"
case ":${PATH:-}:" in
*":$(dirname "$launcher"):"*) ;;
*) echo "$(dirname "$launcher") is not on PATH: add it, e.g. export PATH=\"$(dirname "$launcher"):\$PATH\" in your shell profile" ;;
esac
