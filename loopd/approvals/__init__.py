"""Asking a person before brokerd runs a tool that acts on the world.

brokerd refuses a call of a tool that asks (``brokerd.approval``) with an approval id that only
loopd sees. loopd asks a person, then sends the call again with the decision; brokerd's answer,
the tool result the model reads, says who allowed or denied it. The package:

- ``loopd.approvals.call``: the call that waits, the decision, and the ``Asker`` protocol a front
  end implements (the thread's reaction in ``loopd.chat.approvals``, the terminal's y/N in
  ``loopd.terminal.approve``);
- ``loopd.approvals.deciders``: who may decide on a turn's calls, one rule;
- ``loopd.approvals.notes``: the question and the decision as session-log notes, and the
  question found again after a restart;
- ``loopd.approvals.words``: what a person reads of the call and the time limit;
- ``loopd.approvals.wait``: the shell that records, asks and sends the call again.
"""
