"""``odradek groups``: list, describe with lag, reset offsets (dry run and execute), delete,
and one-line errors, through the real command line against a real broker."""
from __future__ import annotations

from odradek import Consumer, Producer, TopicPartition
from tests.client.test_groups import create_topic
from tests.client.test_tools import odradek


def test_groups_list_describe_reset_and_delete(broker):
    create_topic(broker, "t", 2)
    with Producer(broker.bootstrap, linger_ms=0) as p:
        for i in range(10):
            p.send("t", value=b"x", partition=i % 2)
        p.flush()
    bs = ["--bootstrap-server", broker.bootstrap]
    with Consumer(broker.bootstrap, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False) as c:
        c.subscribe(["t"])
        got = []
        while len(got) < 10:
            got += c.poll(200)
        c.commit({TopicPartition("t", 0): 3, TopicPartition("t", 1): 5})
        listed = odradek("groups", "--list", *bs)
        assert listed.returncode == 0 and listed.stdout.split() == ["g", "Stable"]
        described = odradek("groups", "--describe", "g", *bs)
        assert described.returncode == 0, described.stderr
        rows = {tuple(line.split()[:2]): line.split() for line in described.stdout.splitlines()
                if line.startswith("t ")}
        assert rows[("t", "0")][2:5] == ["3", "5", "2"] and rows[("t", "1")][2:5] == ["5", "5", "0"]
        assert "127.0.0.1" in described.stdout and "t-0,t-1" in described.stdout
        busy = odradek("groups", "--reset-offsets", "g", "--to-earliest", "--execute", *bs)
        assert busy.returncode == 1 and "NON_EMPTY_GROUP" in busy.stderr and "inactive" in busy.stderr
    # The consumer closed (and committed its positions, 5 and 5): the group is inactive now.
    plan = odradek("groups", "--reset-offsets", "g", "--topic", "t", "--shift-by", "-2", *bs)
    assert plan.returncode == 0 and "dry run" in plan.stdout
    done = odradek("groups", "--reset-offsets", "--group", "g", "--topic", "t", "--to-earliest", "--execute", *bs)
    assert done.returncode == 0, done.stderr
    with Consumer(broker.bootstrap, group_id="g") as c:
        assert c.committed(TopicPartition("t", 0)) == 0 and c.committed(TopicPartition("t", 1)) == 0
    # --topic T:P: that partition only; --to-offset past the log end (5) becomes the log end
    one = odradek("groups", "--reset-offsets", "g", "--topic", "t:1", "--to-offset", "99", "--execute", *bs)
    assert one.returncode == 0, one.stderr
    assert [line.split()[-3:] for line in one.stdout.splitlines()[1:]] == [["1", "0", "5"]]
    with Consumer(broker.bootstrap, group_id="g") as c:
        assert c.committed(TopicPartition("t", 0)) == 0 and c.committed(TopicPartition("t", 1)) == 5
    assert odradek("groups", "--delete", "g", *bs).returncode == 0
    missing = odradek("groups", "--describe", "g", *bs)
    assert missing.returncode == 1 and "GROUP_ID_NOT_FOUND" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    no_target = odradek("groups", "--reset-offsets", "g", *bs)
    assert no_target.returncode == 1 and "--to-earliest" in no_target.stderr
