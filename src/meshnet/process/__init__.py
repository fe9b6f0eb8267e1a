"""Child processes a supervisor starts: launched, awaited, stopped, and never outliving it.

``launcher`` starts a command with its stderr in a log file and waits for the ready line it
prints; ``lifeline`` ties the child's life to the supervisor's (``tether`` holds it for a
program that cannot, such as etcd); ``ports`` checks a fixed port is free before anything
starts. ``meshnet up``, the bench and the test harnesses all start their processes here. This
package imports nothing of meshnet's but ``core``.
"""
