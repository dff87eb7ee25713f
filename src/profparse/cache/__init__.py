"""A user-level cache of parsed traces, so that a second verb on the same trace does not read the JSON again.

One entry per (trace content, profparse code, parse options), a folder of Arrow IPC files (LZ4-compressed:
an event table takes a tenth of the space, for a little more time per warm load; docs/cache.md) plus
``meta.json``:

- ``events.arrow`` (the raw event table), ``links.arrow`` and ``attribution.arrow`` (their per-row arrays),
  ``links.threads.arrow`` and ``attribution.steps.arrow``, and in ``meta.json`` the header, the decode report,
  track names and the rules: everything :class:`profparse.api.ParsedTrace` is built from;
- ``table.<name>.arrow``: each table a verb computed (stage summary, kernels, ops, warnings, analyses), added
  as it is computed, so the next verb reads it instead of computing it.

Key: XXH3-128 of the file's bytes, and a blake2b of profparse's version, the format version, the source of every
profparse module and the versions of numpy/pandas/pyarrow/msgspec (so an edited checkout never reads stale
tables), and the options that change results (``include_marks``, ``strict``). XXH3 hashes a trace ~20x faster
than blake2b; a ``stat/`` record (device, inode, size, mtime_ns, ctime_ns -> hash) skips it when the file is
unchanged, and is only written when the file's times are old enough (git's "racy" rule).

Ownership: the cache only writes, evicts and sweeps in a folder it made, marked by ``CACHEDIR.TAG`` (mode 0700,
owned by the user); a configured folder that already holds other files gets a subfolder of its own, and only
names the cache generates, regular files and real folders, are ever removed.

Safety: every file and the entry folder are written under a temporary name in the cache folder and renamed
into place (readers never see half an entry; of two writers of one entry the first rename wins, the second
is discarded); each table is checked to read back identical before it is kept; every stored file carries an
XXH3-128 checksum (Arrow files a trailer, JSON files a field); an entry that does not read back (truncated,
flipped bits, wrong types) is removed with a warning and the trace is parsed again; any OSError while writing
(read-only folder, full disk) turns caching off for the run with a note, never an error.
Size-bounded: past ``PROFPARSE_CACHE_MAX_BYTES`` (default 2 GiB; 0 turns the cache off) the least recently
used entries are removed.

Modules, by idea (nothing is re-exported here: import from the module that defines a name):

- :mod:`~profparse.cache.store`: the cache folder (:class:`~profparse.cache.store.Cache`: open, claim, key, get,
  put, evict, remove), ``PROFPARSE_CACHE_DIR`` / ``PROFPARSE_CACHE_MAX_BYTES``;
- :mod:`~profparse.cache.entry`: one stored trace (``Entry``: table, put_table, put_text, put_output);
- :mod:`~profparse.cache.keys`: content hash, code fingerprint, parse options (``load_options``), result names;
- :mod:`~profparse.cache.core`: a ParsedTrace's core (events, links, attribution) to files and back;
- :mod:`~profparse.cache.frames`: Arrow files of DataFrames (``write_frame``, ``read_frame``);
- :mod:`~profparse.cache.sealed`: the checksums every stored file carries;
- :mod:`~profparse.cache.replay`: checking a verb's stored text or files before replaying them;
- :mod:`~profparse.cache.folders`: which folders and names the cache owns, and removing them safely.
"""
