"""The views both engines add over the perfetto-style tables: ancestor, slice_with_range, slice_thread."""

from __future__ import annotations

import re

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")

ANCESTOR_SQL = """
CREATE {table} ancestor AS
WITH RECURSIVE up(slice_id, ancestor_id) AS (
  SELECT id, parent_id FROM slice WHERE parent_id IS NOT NULL
  UNION ALL
  SELECT up.slice_id, p.parent_id FROM up JOIN slice p ON p.id = up.ancestor_id
  WHERE p.parent_id IS NOT NULL)
SELECT slice_id, ancestor_id FROM up
"""

SLICE_WITH_RANGE_SQL = """
CREATE {view} slice_with_range AS
SELECT s.id, s.ts, s.dur, s.category, s.category AS cat, s.name, s.depth, s.parent_id, s.track_id,
       s.arg_set_id, r.id AS range_id, r.name AS range_name, r.category AS range_category,
       r.depth AS range_depth, r.ts AS range_ts, r.dur AS range_dur
FROM ancestor a
JOIN slice s ON s.id = a.slice_id
JOIN slice r ON r.id = a.ancestor_id
WHERE r.category IN ('user_annotation', 'gpu_user_annotation')
"""

SLICE_THREAD_SQL = f"""
CREATE {{view}} slice_thread AS
SELECT s.id, s.ts, s.dur, s.category, s.category AS cat, s.name, s.depth, s.parent_id, s.track_id,
       s.arg_set_id, t.utid, t.tid, t.name AS thread_name, p.upid, p.pid, p.name AS process_name,
       (s.category IN ({", ".join(repr(c) for c in GPU_CATEGORIES)})
        OR COALESCE(t.name, '') LIKE 'stream%') AS is_gpu
FROM slice s
LEFT JOIN thread_track tt ON tt.id = s.track_id
LEFT JOIN thread t ON t.utid = tt.utid
LEFT JOIN process p ON p.upid = t.upid
"""

_NEEDS_ANCESTOR = re.compile(r"\b(ancestor|slice_with_range)\b", re.IGNORECASE)


def needs_ancestor(sql: str) -> bool:
    return _NEEDS_ANCESTOR.search(sql) is not None
