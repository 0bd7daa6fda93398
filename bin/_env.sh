# Shared by bin/odradek and bin/test: make sure .venv exists and holds the project with the
# requested extras. Re-installs only when pyproject.toml or the extras change.
# Usage: source bin/_env.sh; ensure_env "extra1,extra2"   (empty string for none)
ODRADEK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ODRADEK_ROOT/.venv"

ensure_env() {
    local extras="$1"
    local want
    want="$(cat "$ODRADEK_ROOT/pyproject.toml" | sha256sum | cut -c1-16)"
    local stamp="$VENV/.odradek-installed"
    if [ ! -x "$VENV/bin/python" ]; then
        local py="${PYTHON:-}"
        if [ -z "$py" ]; then
            for cand in python3.11 python3.12 python3.13 python3; do
                if command -v "$cand" >/dev/null 2>&1; then py="$cand"; break; fi
            done
        fi
        [ -n "$py" ] || { echo "odradek: no python3 found (need Python 3.11 or newer)" >&2; exit 1; }
        echo "odradek: creating $VENV with $($py --version 2>&1)" >&2
        "$py" -m venv "$VENV" || { echo "odradek: could not create $VENV" >&2; exit 1; }
    fi
    # The stamp lists the pyproject hash and every extra installed so far.
    local have=""
    [ -f "$stamp" ] && have="$(cat "$stamp")"
    local need_install=0
    case "$have" in "$want"*) ;; *) need_install=1; have="$want" ;; esac
    local e
    for e in ${extras//,/ }; do
        case " $have " in *" $e "*) ;; *) need_install=1; have="$have $e" ;; esac
    done
    if [ "$need_install" = 1 ]; then
        local spec="$ODRADEK_ROOT"
        local all_extras
        all_extras="$(echo "$have" | cut -d' ' -f2- -s | tr ' ' ',')"
        [ -n "$all_extras" ] && spec="$ODRADEK_ROOT[$all_extras]"
        echo "odradek: installing the project into $VENV${all_extras:+ (extras: $all_extras)}" >&2
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2 || true
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$spec" >&2 \
            || { echo "odradek: pip install failed; see the messages above" >&2; exit 1; }
        echo "$have" > "$stamp"
    fi
    # PySpark registers data sources from top-level modules named pyspark_*: put the
    # connector's hook on the environment's path so `format("odradek")` needs no set-up.
    local site
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    if [ ! -f "$site/odradek-autoload.pth" ]; then
        echo "$ODRADEK_ROOT/pipeline/autoload" > "$site/odradek-autoload.pth"
    fi
}
