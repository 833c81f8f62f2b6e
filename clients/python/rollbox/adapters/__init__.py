"""
Drop-in shapes for the trainers people use, duck-typed so their frameworks need not be
installed: `verl.RollboxTool` (verl's BaseTool), `rllm.RollboxSandbox` (rLLM's Sandbox
protocol), `harbor.RollboxEnvironment` (Harbor's BaseEnvironment, as SkyRL uses it).
"""
