"""A small example environment: arithmetic questions answered with a calculator.

Served by `ors-grpc serve` when no environment is named, so the first
command of the README runs something real.
"""

from __future__ import annotations

from pydantic import BaseModel

from ors_grpc import Environment, Split, TextBlock, ToolOutput, tool

_TASKS = {
    "train": [
        {"id": 0, "question": "What is 12 + 30?", "answer": 42},
        {"id": 1, "question": "What is 7 * 6?", "answer": 42},
        {"id": 2, "question": "What is 123 + 456?", "answer": 579},
        {"id": 3, "question": "What is 25 * 4 + 3?", "answer": 103},
    ],
    "test": [
        {"id": 4, "question": "What is 99 * 99?", "answer": 9801},
        {"id": 5, "question": "What is (17 + 3) * 5?", "answer": 100},
    ],
}


class CalculatorInput(BaseModel):
    """Two numbers and an operation."""

    a: float
    b: float
    op: str = "+"


class SubmitInput(BaseModel):
    """The final answer."""

    answer: float


_OPERATIONS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
}


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


class Arithmetic(Environment):
    """Answer an arithmetic question; a calculator is at hand."""

    @classmethod
    def list_splits(cls) -> list[Split]:
        return [Split(name="train", type="train"), Split(name="test", type="test")]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return _TASKS[split]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=f"{self.task_spec['question']} Use the calculator, then submit the answer.")]

    @tool
    def calculator(self, params: CalculatorInput) -> ToolOutput:
        """Compute `a op b`, where op is one of + - * /."""
        operation = _OPERATIONS.get(params.op)
        if operation is None:
            return ToolOutput(blocks=[TextBlock(text=f"unknown operation {params.op!r}; use + - * /")])
        if params.op == "/" and params.b == 0:
            return ToolOutput(blocks=[TextBlock(text="division by zero")])
        return ToolOutput(blocks=[TextBlock(text=_number(operation(params.a, params.b)))])

    @tool
    def submit(self, params: SubmitInput) -> ToolOutput:
        """Submit the final answer; ends the episode."""
        correct = params.answer == self.task_spec["answer"]
        verdict = "Correct!" if correct else f"Wrong, the answer was {self.task_spec['answer']}."
        return ToolOutput(blocks=[TextBlock(text=verdict)], reward=1.0 if correct else 0.0, finished=True)
