/** Runs the compiled `mesh-agent` command as a child process and collects its output. */
import { spawn } from 'node:child_process';
import { MAIN_JS } from './agent-process.js';

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** A command that should end by itself; one still running after `timeoutMs` is killed. */
export function runCli(
  args: string[],
  env: Record<string, string> = {},
  timeoutMs = 15_000,
): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [MAIN_JS, ...args], {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => {
      stdout += c.toString();
    });
    child.stderr.on('data', (c: Buffer) => {
      stderr += c.toString();
    });
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}
