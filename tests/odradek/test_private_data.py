"""A broker's data and run files are its user's alone, whatever the umask it was started
with (issue 16, defects 17 and 18): directories 0700, files and sockets 0600."""
import os
import stat

from odradek import Admin, Producer


def test_data_run_files_and_sockets_are_private_under_umask_000(start_broker, tmp_path):
    old = os.umask(0)
    try:
        broker = start_broker(str(tmp_path / "data"))
    finally:
        os.umask(old)
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("private", partitions=2)
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        producer.send("private", b"secret").result(10)
    loose = {}
    seen = set()
    for top in (str(tmp_path / "data"), broker.run_dir):
        for root, dirs, files in os.walk(top):
            for name in dirs + files:
                if root == str(tmp_path / "data") and name.startswith("broker.std"):
                    continue  # the test harness's (odradek.local) capture of the broker's output
                path = os.path.join(root, name)
                st = os.lstat(path)
                seen.add(name)
                want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
                if stat.S_IMODE(st.st_mode) != want:
                    loose[os.path.relpath(path, str(tmp_path))] = oct(stat.S_IMODE(st.st_mode))
    assert {"topics.json", "processor-0.sock", "supervisor.mbox"} <= seen
    assert any(name.endswith(".log") for name in seen)
    assert loose == {}
