# Shared by bin/odradek and bin/test: make sure .venv exists and holds the project with the
# requested extras. Re-installs only when pyproject.toml, setup.py, the C extension or the extras change.
# Usage: source bin/_env.sh; ensure_env "extra1,extra2"   (empty string for none)
ODRADEK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ODRADEK_ROOT/.venv"

ensure_env() {
    local extras="$1"
    local want
    # setup.py and the C sources it builds too: a changed extension is rebuilt, never left stale
    want="$(cat "$ODRADEK_ROOT/pyproject.toml" "$ODRADEK_ROOT/setup.py" "$ODRADEK_ROOT/core/_recordscan.c" \
        "$ODRADEK_ROOT/odradek/_recordbuild.c" | sha256sum | cut -c1-16)"
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

# Cluster mode (bin/test, `bin/odradek cluster ...`) runs a local ZooKeeper: Debian's
# `zookeeper` package and a Java runtime. Installed once, when missing; silent otherwise.
# `bin/odradek serve` (one broker) never calls this: it needs no ZooKeeper.
ensure_zookeeper() {
    if [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1; then
        return 0
    fi
    local sudo=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 || {
            echo "odradek: ZooKeeper is missing and there is no sudo: run \`apt-get install zookeeper default-jre-headless\` as root" >&2
            return 1
        }
        sudo="sudo"
    fi
    command -v apt-get >/dev/null 2>&1 || {
        echo "odradek: ZooKeeper is missing (/usr/share/java/zookeeper.jar) and apt-get is not available; install ZooKeeper 3.x and set ODRADEK_ZOOKEEPER_CLASSPATH" >&2
        return 1
    }
    echo "odradek: installing ZooKeeper (Debian's zookeeper package) for cluster mode" >&2
    local pkgs="zookeeper"
    command -v java >/dev/null 2>&1 || pkgs="$pkgs default-jre-headless"
    # Try without refreshing the package lists first (fast when they are current).
    if ! $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >/dev/null 2>&1; then
        $sudo apt-get update -qq >&2 || true
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >&2 || {
            echo "odradek: could not install $pkgs; see the messages above" >&2
            return 1
        }
    fi
    [ -f /usr/share/java/zookeeper.jar ] || { echo "odradek: zookeeper installed but /usr/share/java/zookeeper.jar is missing" >&2; return 1; }
}

# Debian packages the tests drive, installed once when missing (silent otherwise), the way
# ensure_zookeeper does: `apt_install WHAT PACKAGE...` (WHAT says who needs them).
apt_install() {
    local what="$1"; shift
    local sudo=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 || { echo "odradek: $* missing ($what): run \`apt-get install $*\` as root" >&2; return 1; }
        sudo="sudo"
    fi
    command -v apt-get >/dev/null 2>&1 || { echo "odradek: $* missing ($what) and apt-get is not available" >&2; return 1; }
    echo "odradek: installing $* ($what)" >&2
    if ! $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1; then
        $sudo apt-get update -qq >&2 || true
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 || {
            echo "odradek: could not install $*; see the messages above" >&2
            return 1
        }
    fi
}

# The web console's tests (tests/observability/test_console_browser.py) and
# bin/console-screenshots drive Debian's chromium through chromium-driver (selenium).
ensure_chromium() {
    command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && return 0
    apt_install "the console's browser tests" chromium chromium-driver
}

# tests/kafka drive `kcat` (Debian's kcat package), a real Kafka tool no one here wrote.
ensure_kcat() {
    command -v kcat >/dev/null 2>&1 && return 0
    apt_install "the Kafka tool tests in tests/kafka" kcat
}

# tests/observability check /metrics with `promtool check metrics` and scrape a broker with a
# real Prometheus: both from Debian's prometheus package (its service is not started).
ensure_promtool() {
    command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 && return 0
    apt_install "the metrics tests in tests/observability" prometheus
}
