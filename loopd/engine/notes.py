"""Lines loopd adds after an answer, in the words both front ends show (a thread's answer post,
the terminal). Pure: text only."""


def cut_note(tokens: int | None) -> str:
    """The answer ended because the server reached ``max_tokens``, not because the model was done:
    without this line a cut answer reads as a finished one."""
    where = f"after {tokens} tokens" if tokens else "at its length limit"
    return (
        f"(The answer was cut {where}: the most one reply may have. Ask me to go on for the rest.)"
    )
