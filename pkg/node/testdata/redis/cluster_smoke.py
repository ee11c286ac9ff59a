#!/usr/bin/python3
"""Smoke test of a Redis Cluster endpoint with redis-py's RedisCluster.

Usage: cluster_smoke.py HOST PORT [MIN_PRIMARIES]

Written for Debian's python3-redis (4.3.4) and the system python
(/usr/bin/python3). It expects a fresh cluster (no keys under the "py:"
prefixes it uses). Exits 0 on success; on failure prints what went wrong and
exits 1. Run by TestRedisPySmoke in pkg/node/redis_test.go.
"""

import logging
import sys
import time

from redis.cluster import RedisCluster


def fail(msg):
    print("cluster_smoke.py: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    host, port = sys.argv[1], int(sys.argv[2])
    min_primaries = int(sys.argv[3]) if len(sys.argv) == 4 else 1

    # redis-py logs every MOVED and error reply it handles with a traceback;
    # the checks below report what matters.
    logging.getLogger("redis").addHandler(logging.NullHandler())
    logging.getLogger("redis").propagate = False

    rc = RedisCluster(
        host=host,
        port=port,
        decode_responses=True,
        socket_timeout=10,
        socket_connect_timeout=5,
        require_full_coverage=True,
        cluster_error_retry_attempts=10,
    )

    # The topology: every slot covered, enough primaries.
    primaries = rc.get_primaries()
    check(len(primaries) >= min_primaries,
          "%d primaries, want >= %d: %s" % (len(primaries), min_primaries, primaries))
    info = rc.cluster_info()
    check(info.get("cluster_state") == "ok", "CLUSTER INFO: %r" % (info,))
    check(int(info.get("cluster_slots_assigned", 0)) == 16384,
          "CLUSTER INFO slots assigned: %r" % (info,))
    covered = 0
    for (start, end), desc in rc.cluster_slots().items():
        covered += end - start + 1
        check(desc.get("primary"), "slot range %d-%d has no primary: %r" % (start, end, desc))
    check(covered == 16384, "CLUSTER SLOTS covers %d slots, want 16384" % covered)
    check(rc.ping(), "PING")
    check(rc.keyslot("foo") == 12182, "keyslot(foo) = %r" % rc.keyslot("foo"))

    # SET/GET across slots, through redirects.
    n = 300
    keys = ["py:key:%d" % i for i in range(n)]
    nodes = set()
    for i, k in enumerate(keys):
        check(rc.set(k, "value-%d" % i) is True, "SET %s" % k)
        nodes.add(rc.get_node_from_key(k).name)
    check(len(nodes) >= min(min_primaries, 2),
          "%d keys landed on only %d node(s): %s" % (n, len(nodes), nodes))
    for i, k in enumerate(keys):
        v = rc.get(k)
        check(v == "value-%d" % i, "GET %s = %r, want %r" % (k, v, "value-%d" % i))
    check(rc.get("py:missing") is None, "GET of a missing key")
    check(rc.exists("py:key:0") == 1, "EXISTS")

    # DBSIZE summed over the primaries: exactly our keys (the cluster is fresh).
    size = rc.dbsize(target_nodes=RedisCluster.PRIMARIES)
    check(size == n, "DBSIZE over the primaries = %r, want %d" % (size, n))

    # MSET/MGET in one slot (hash tag), and MGET across slots.
    tagged = {"py:{tag}:%d" % i: "t%d" % i for i in range(20)}
    check(rc.mset(tagged) is True, "MSET with a hash tag")
    got = rc.mget(list(tagged))
    check(got == list(tagged.values()), "MGET with a hash tag = %r" % (got,))
    got = rc.mget_nonatomic(keys[:50])
    check(got == ["value-%d" % i for i in range(50)], "MGET across slots = %r" % (got,))
    try:
        rc.execute_command("MGET", "py:{a}x", "py:{b}y")
        fail("MGET across slots in one command did not fail")
    except Exception as e:  # redis-py raises before sending, or the server says CROSSSLOT
        check("slot" in str(e).lower(), "MGET across slots: %r" % (e,))

    # INCR/INCRBY/DECR, APPEND, STRLEN.
    for i in range(1, 11):
        check(rc.incr("py:ctr") == i, "INCR #%d" % i)
    check(rc.incrby("py:ctr", 5) == 15, "INCRBY")
    check(rc.decr("py:ctr") == 14, "DECR")
    check(rc.get("py:ctr") == "14", "GET counter")
    check(abs(rc.incrbyfloat("py:ctr", 0.5) - 14.5) < 1e-9, "INCRBYFLOAT")
    check(rc.append("py:log", "ab") == 2 and rc.append("py:log", "cd") == 4, "APPEND")
    check(rc.strlen("py:log") == 4 and rc.get("py:log") == "abcd", "STRLEN/GET after APPEND")
    try:
        rc.incr("py:log")
        fail("INCR of a non-integer did not fail")
    except Exception as e:
        check("not an integer" in str(e), "INCR of a non-integer: %r" % (e,))

    # EXPIRE/TTL/PEXPIRE/PERSIST; a short expiry really expires.
    check(rc.expire("py:key:1", 100) is True, "EXPIRE")
    ttl = rc.ttl("py:key:1")
    check(98 <= ttl <= 100, "TTL = %r" % ttl)
    pttl = rc.pttl("py:key:1")
    check(95000 <= pttl <= 100000, "PTTL = %r" % pttl)
    check(rc.persist("py:key:1") is True and rc.ttl("py:key:1") == -1, "PERSIST")
    check(rc.ttl("py:missing") == -2, "TTL of a missing key")
    check(rc.set("py:short", "v", px=100) is True, "SET PX")
    check(rc.pexpire("py:key:2", 100) is True, "PEXPIRE")
    time.sleep(0.5)
    check(rc.get("py:short") is None, "a key with PX 100 is still there after 500ms")
    check(rc.get("py:key:2") is None, "a key with PEXPIRE 100 is still there after 500ms")
    check(rc.set("py:nx", "a", nx=True) is True and rc.set("py:nx", "b", nx=True) is None, "SET NX")
    check(rc.getset("py:nx", "c") == "a", "GETSET")
    check(rc.getdel("py:nx") == "c" and rc.get("py:nx") is None, "GETDEL")

    # SCAN over every primary finds exactly our keys (minus the expired one).
    found = set(rc.scan_iter(match="py:key:*", count=50))
    want = set(keys) - {"py:key:2"}
    check(found == want, "SCAN over all nodes: %d keys, want %d; missing %s, extra %s"
          % (len(found), len(want), sorted(want - found)[:10], sorted(found - want)[:10]))

    # DEL across slots (redis-py splits it by slot).
    deleted = rc.delete(*keys)
    check(deleted == n - 1, "DEL of %d keys (one expired) deleted %r" % (n, deleted))
    check(rc.mget_nonatomic(keys[:10]) == [None] * 10, "keys still there after DEL")
    check(rc.unlink(*tagged) == len(tagged), "UNLINK with a hash tag")
    check(rc.delete("py:ctr", "py:log") == 2, "DEL")
    left = list(rc.scan_iter(match="py:*"))
    check(left == [], "keys left after deleting everything: %r" % (left,))

    rc.close()
    print("cluster_smoke.py: OK (%d primaries, %d keys across %d nodes)" % (len(primaries), n, len(nodes)))


if __name__ == "__main__":
    main()
