"""The base layer: what every other layer may use and that uses none of them.

Errors and exit codes (:mod:`.errors`), atomic files (:mod:`.files`), text formats (:mod:`.formats`), name
shortening (:mod:`.names`), stage and mark names (:mod:`.marks`), phase timing (:mod:`.phase_clock`) and the
version (:mod:`.version`).
"""
