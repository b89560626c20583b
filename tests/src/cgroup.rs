//! A cgroup of the io controller's hierarchy for one test, and a process
//! in it: the agent names a stalled bio's pod or cgroup from the cgroup the
//! block layer charges the bio to (`health_node::volumes::waiters`).

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context as _, Result};
use health_node::volumes::waiters::io_hierarchy;

/// Made under the hierarchy's root and removed on drop (on cgroup v2 with
/// the io controller enabled for the root's children first).
pub struct TestCgroup {
    dir: PathBuf,
    /// As the agent names it: the path from the hierarchy's root.
    pub path: String,
}

impl TestCgroup {
    pub fn new(name: &str) -> Result<Self> {
        let root = io_hierarchy(Path::new("/sys/fs/cgroup"), Path::new("/proc"))
            .map_err(anyhow::Error::msg)
            .context("the io controller's cgroup hierarchy")?;
        let control = root.join("cgroup.subtree_control");
        if control.is_file() {
            std::fs::write(&control, "+io")
                .with_context(|| format!("enabling io in {}", control.display()))?;
        }
        let path = format!("/volume-health-{name}-{}", std::process::id());
        let dir = root.join(&path[1..]);
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(TestCgroup { dir, path })
    }

    /// One O_DIRECT write of 4 KiB at `offset` (a multiple of 4 KiB) by
    /// `dd`, a process of this cgroup: it moves itself in, then execs.
    pub fn o_direct_write(&self, dev: &Path, offset: u64) -> Result<Child> {
        let script = format!(
            "echo $$ > {}/cgroup.procs && exec dd if=/dev/zero of={} bs=4096 count=1 seek={} oflag=direct conv=notrunc status=none",
            self.dir.display(),
            dev.display(),
            offset / 4096
        );
        Command::new("sh")
            .args(["-c", &script])
            .spawn()
            .context("starting dd")
    }
}

impl TestCgroup {
    /// A process of this cgroup that holds `file` open and reads it where
    /// told (`bin`: the tests' `file-reader`): an application whose reads
    /// fail, for the errors a file operation returns (`--returned-errors`).
    /// The file is open when this returns, so its reads go on after the
    /// file's filesystem stops answering opens.
    pub fn reader(&self, bin: &Path, file: &Path) -> Result<Reader> {
        self.start_reader(bin, file, false)
    }

    /// [`TestCgroup::reader`] with the file open for writing too, for
    /// [`Reader::pwrite`].
    pub fn writer(&self, bin: &Path, file: &Path) -> Result<Reader> {
        self.start_reader(bin, file, true)
    }

    fn start_reader(&self, bin: &Path, file: &Path, write: bool) -> Result<Reader> {
        let mut child = Command::new(bin)
            .arg(self.dir.join("cgroup.procs"))
            .arg(file)
            .args(write.then_some("rw"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdin = child.stdin.take().context("the reader's stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("the reader's stdout")?);
        let mut reader = Reader {
            child,
            stdin,
            stdout,
        };
        let first = reader.line()?;
        anyhow::ensure!(
            first == "open",
            "the reader said {first:?} instead of opening {}",
            file.display()
        );
        Ok(reader)
    }
}

/// See [`TestCgroup::reader`]; killed on drop.
pub struct Reader {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Reader {
    /// Reads 4 KiB at `offset`: `None` when it succeeded, else the errno.
    pub fn pread(&mut self, offset: u64) -> Result<Option<i32>> {
        self.ask(&offset.to_string())
    }

    /// Writes 4 KiB at `offset` (a [`TestCgroup::writer`]): `None` when it
    /// succeeded, else the errno.
    pub fn pwrite(&mut self, offset: u64) -> Result<Option<i32>> {
        self.ask(&format!("w {offset}"))
    }

    /// Sends one request, returns the errno answered (0: none).
    fn ask(&mut self, request: &str) -> Result<Option<i32>> {
        writeln!(self.stdin, "{request}").context("asking the reader")?;
        let answer = self.line()?;
        let errno: i32 = answer
            .parse()
            .with_context(|| format!("the reader answered {answer:?} to {request:?}"))?;
        Ok((errno != 0).then_some(errno))
    }

    fn line(&mut self) -> Result<String> {
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .context("reading the reader's answer")?;
        anyhow::ensure!(n > 0, "the reader exited");
        Ok(line.trim_end().to_string())
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("removing {}: {e}", self.dir.display());
        }
    }
}
