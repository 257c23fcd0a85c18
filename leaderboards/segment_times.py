"""Wall time of a sweep segment by track and task, from the store's write times: each gap between consecutive
distinct ``created_at`` is charged to the job written at its end (two workers: a share of the wall time, not of the
CPU). Usage: ``python leaderboards/segment_times.py STORE.sqlite START_EPOCH_SECONDS``."""
import sqlite3, json, collections, sys
from datetime import datetime, timezone
c = sqlite3.connect(sys.argv[1])
start = datetime.fromtimestamp(int(sys.argv[2]), timezone.utc)
rows = []
for (r,) in c.execute('select record from runs'):
    d = json.loads(r); t = d.get('tuning') or {}
    track = 'reference' if d['method'] == 'reference' else t.get('mode', 'none')
    rows.append((datetime.fromisoformat(d['created_at']), track, d['task'], d['method'], d.get('epsilon_target')))
rows = sorted(r for r in rows if r[0] >= start)
cells = collections.Counter((r[1], r[2], r[3], r[4]) for r in rows)
first = {}
for r in rows: first.setdefault(r[0], r)
share = collections.Counter(); prev = start
for t in sorted(first):
    share[(first[t][1], first[t][2])] += (t - prev).total_seconds(); prev = t
bytrack = collections.Counter(); ncells = collections.Counter()
for (track, task), v in share.items(): bytrack[track] += v
for (track, task, m, e) in cells: ncells[track] += 1
print(f"segment from {start:%H:%M}, {len(rows)} runs, {len(cells)} cells, {sum(share.values())/60:.0f} min of wall time")
for track in sorted(bytrack, key=bytrack.get, reverse=True):
    print(f"  {track}: {bytrack[track]/60:.0f} min, {ncells[track]} cells; by task: " + ", ".join(
        f"{task} {v/60:.0f}" for (tr, task), v in sorted(share.items(), key=lambda kv: -kv[1]) if tr == track))
