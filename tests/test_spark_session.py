"""core.spark's session life cycle (in a file of its own: no other session may be alive)."""
import shutil

from conftest import require_or_skip


def test_a_stopped_session_leaves_no_jvm_behind():
    """stop_spark ends the JVM pyspark keeps for the process (it stayed busy on a core for
    the rest of a test session), and a session started afterwards works."""
    require_or_skip(shutil.which("java") is not None, "Spark needs a Java runtime")
    import psutil
    from core.spark import local_conf, start_spark, stop_spark

    def jvms():
        return [p for p in psutil.Process().children(recursive=True) if "java" in p.name()]
    for _ in range(2):
        session = start_spark(local_conf("local[1]", "stop-test", 1))
        assert session.range(7).count() == 7 and jvms()
        stop_spark(session)
        assert jvms() == []
