"""Configuration values (``halfpi.config``): the store URL and what it names."""

from __future__ import annotations

from pathlib import Path

import pytest

from halfpi.config import Config, check_store_url, sqlite_file


def test_the_database_is_in_the_home_by_default(tmp_path: Path) -> None:
    assert Config(home=tmp_path).db_path == tmp_path / "halfpi.db"


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///srv/halfpi/minds.db", Path("/srv/halfpi/minds.db")),
        ("SQLite:///srv/a%20b.db", Path("/srv/a b.db")),
        ("sqlite:relative/minds.db", Path("relative/minds.db")),
        ("sqlite:~/minds.db", Path("~/minds.db").expanduser()),
    ],
)
def test_a_sqlite_url_names_its_file(url: str, path: Path) -> None:
    assert sqlite_file(url) == path
    assert Config(home=Path("/unused"), store_url=url).db_path == path


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://me:secret@db:5432/halfpi",
        "postgres://db/halfpi",
        "postgresql+asyncpg://db/halfpi?sslmode=require",
        "sqlite:///srv/halfpi.db",
    ],
)
def test_a_store_url_may_name_postgresql_or_a_sqlite_file(url: str) -> None:
    assert check_store_url(url) == url
    assert Config(home=Path("/home"), store_url=url).postgres == url.startswith("postgres")


@pytest.mark.parametrize("url", ["mysql://me:secret@db/halfpi", "/srv/halfpi.db", "sqlite:"])
def test_any_other_store_url_is_refused_in_one_line_naming_both_kinds(url: str) -> None:
    with pytest.raises(ValueError) as refused:
        check_store_url(url)
    assert "\n" not in str(refused.value) and "secret" not in str(refused.value)
    assert "sqlite:///PATH" in str(refused.value)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("postgresql://me:secret@db:5432/halfpi", ("PostgreSQL", "names no file")),
        ("postgres://me:secret@db/halfpi", ("PostgreSQL",)),
        ("postgresql+psycopg://me:secret@db/halfpi", ("PostgreSQL",)),
        ("mysql://me:secret@db/halfpi", ("mysql:",)),
        ("/srv/halfpi.db", ("not a store URL",)),
        ("sqlite://secret-host/x.db", ("no host",)),
        ("sqlite:///x.db?mode=secret", ("no options",)),
        ("sqlite:", ("names no file",)),
    ],
)
def test_a_store_url_this_halfpi_cannot_use_is_one_line_without_the_url(
    url: str, words: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError) as refused:
        sqlite_file(url)
    message = str(refused.value)
    assert "\n" not in message
    assert "secret" not in message  # a URL may carry a password: never repeated
    assert "sqlite:///PATH" in message
    for word in words:
        assert word in message
    with pytest.raises(ValueError):
        _ = Config(home=Path("/unused"), store_url=url).db_path


def test_the_private_paths_are_the_home_and_the_database_files_wherever_they_are(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    assert Config(home=home).private_paths[0] == home
    elsewhere = Config(home=home, store_url=f"sqlite://{tmp_path}/data/minds.db")
    assert elsewhere.private_paths == (
        home,
        tmp_path / "data" / "minds.db",
        tmp_path / "data" / "minds.db-wal",
        tmp_path / "data" / "minds.db-shm",
        tmp_path / "data" / "minds.db-journal",
    )
