/*
    Copyright (c) 2007-2016 Contributors as noted in the AUTHORS file

    This file is part of libzmq, the ZeroMQ core engine in C++.

    libzmq is free software; you can redistribute it and/or modify it under
    the terms of the GNU Lesser General Public License (LGPL) as published
    by the Free Software Foundation; either version 3 of the License, or
    (at your option) any later version.

    As a special exception, the Contributors give you permission to link
    this library with independent modules to produce an executable,
    regardless of the license terms of these independent modules, and to
    copy and distribute the resulting executable under terms of your choice,
    provided that you also meet, for each linked independent module, the
    terms and conditions of the license of that module. An independent
    module is a module which is not derived from or based on this library.
    If you modify this library, you must extend this exception to your
    version of the library.

    libzmq is distributed in the hope that it will be useful, but WITHOUT
    ANY WARRANTY; without even the implied warranty of MERCHANTABILITY or
    FITNESS FOR A PARTICULAR PURPOSE. See the GNU Lesser General Public
    License for more details.

    You should have received a copy of the GNU Lesser General Public License
    along with this program.  If not, see <http://www.gnu.org/licenses/>.
*/

//  Modified for emq on 2026-12-04: accept failing for lack of resources
//  (EMFILE, ENFILE, ENOBUFS, ENOMEM) pauses the listener instead of
//  spinning (see EMQ-PATCH.md at the root of this crate).

#ifndef __ZMQ_STREAM_LISTENER_BASE_HPP_INCLUDED__
#define __ZMQ_STREAM_LISTENER_BASE_HPP_INCLUDED__

#include <string>

#include "fd.hpp"
#include "own.hpp"
#include "stdint.hpp"
#include "io_object.hpp"
#include "address.hpp"

namespace zmq
{
class io_thread_t;
class socket_base_t;

class stream_listener_base_t : public own_t, public io_object_t
{
  public:
    stream_listener_base_t (zmq::io_thread_t *io_thread_,
                            zmq::socket_base_t *socket_,
                            const options_t &options_);
    ~stream_listener_base_t () ZMQ_OVERRIDE;

    // Get the bound address for use with wildcards
    int get_local_address (std::string &addr_) const;

  protected:
    virtual std::string get_socket_name (fd_t fd_,
                                         socket_end_t socket_end_) const = 0;

  private:
    //  Handlers for incoming commands.
    void process_plug () ZMQ_FINAL;
    void process_term (int linger_) ZMQ_FINAL;

    //  emq: the back-off timer re-arms polling the listening socket.
    void timer_event (int id_) ZMQ_FINAL;

    enum
    {
        accept_backoff_timer_id = 0x40
    };

    //  emq: how long the listener stops polling for new connections after
    //  accept failed for lack of resources, in milliseconds.
    static const int accept_backoff_ivl = 100;

    //  emq: the back-off timer is running (the listening socket is not
    //  polled for input meanwhile).
    bool _has_accept_backoff_timer;

  protected:
    //  Close the listening socket.
    virtual int close ();

    //  emq: called by in_event when accept () gave no connection, with
    //  errno as accept left it (in_event zeroes errno before accept, so a
    //  connection accept () closed itself, a filtered one, leaves no stale
    //  error). Emits ZMQ_EVENT_ACCEPT_FAILED as before; when the error is
    //  a lack of resources (EMFILE, ENFILE, ENOBUFS, ENOMEM) also stops
    //  polling the listening socket for accept_backoff_ivl ms: it stays
    //  readable while the connection waits in the backlog, so polling it
    //  would call accept () again at once, failing the same way, for as
    //  long as the resources stay short (100 % of a core).
    void accept_failed ();

    virtual void create_engine (fd_t fd);

    //  Underlying socket.
    fd_t _s;

    //  Handle corresponding to the listening socket.
    handle_t _handle;

    //  Socket the listener belongs to.
    zmq::socket_base_t *_socket;

    // String representation of endpoint to bind to
    std::string _endpoint;

    ZMQ_NON_COPYABLE_NOR_MOVABLE (stream_listener_base_t)
};
}

#endif
